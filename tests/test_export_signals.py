"""`workwarden export --out` stopped by a signal leaves no file, not even its scratch file.

The export is held still by a lock on the documents table, taken by the
test before the export starts: the command opens the store, makes its
scratch file beside the target, and waits on its first read. The signal
comes then, while the export is certainly under way.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pg import postgres_database, postgres_url
from support import authority, request
from workwarden.storage.postgres import PostgresStore


@pytest.mark.postgres
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_export_stopped_by_a_signal_leaves_no_file(
    tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with postgres_database() as dsn:
        store = PostgresStore(dsn)
        try:
            authority(store).admit(request(), now=10_000)
        finally:
            store.close()
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE workwarden_documents IN ACCESS EXCLUSIVE MODE")
            argv = ["export", "--store", postgres_url(dsn), "--out", str(out / "export.jsonl")]
            export = subprocess.Popen(
                [sys.executable, "-m", "workwarden", *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                while not any(out.iterdir()):  # its scratch file, made before it reads
                    assert export.poll() is None, export.stderr.read()  # type: ignore[union-attr]
                    time.sleep(0.01)
                export.send_signal(signum)
                _, err = export.communicate(timeout=120)
            finally:
                if export.poll() is None:
                    export.kill()
                    export.wait()
    assert export.returncode == status, err.decode()
    assert b"Traceback" not in err
    assert sorted(out.iterdir()) == []
