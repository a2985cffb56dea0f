"""`workwarden audit --json` prints each record as it reads it, a page at a time.

The whole audit log is what `docs/operations.md` asks an operator to keep
when moving to another store (`workwarden audit --json > audit.jsonl`): it is
never held in memory. Shown without a clock: the command's standard output
is a pipe the test does not read, so the command stops on a full pipe within
its first page of records; records committed while it waits there are in
what it prints, since it reads its later pages only then. A command that
read the whole log before printing would have read it before its first line
could be read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from support import authority, request
from workwarden.storage import SQLiteStore


def test_audit_json_prints_records_as_it_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    with closing(SQLiteStore(path)) as store:
        warden = authority(store)
        # More than a page (1,000 records), and more bytes than a pipe holds (64 KiB).
        for n in range(1_100):
            warden.admit(request(idempotency_key=f"k{n}"), now=10_000 + n)
    audit = subprocess.Popen(
        [sys.executable, "-m", "workwarden", "audit", "--store", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert audit.stdout is not None
        first = json.loads(audit.stdout.readline())
        assert first["sequence"] == 1
        # Committed while the command waits on its full pipe, within its first page.
        with closing(SQLiteStore(path)) as store:
            authority(store).admit(request(idempotency_key="later"), now=20_000)
        # Read through the same buffered stream as the first line (`communicate` would
        # read the pipe beneath it, past what that stream holds already).
        rest = audit.stdout.read()
        audit.wait(timeout=120)
        err = audit.stderr.read() if audit.stderr is not None else b""
    finally:
        if audit.poll() is None:
            audit.kill()
            audit.wait()
    assert audit.returncode == 0, err.decode()
    records = [first, *(json.loads(line) for line in rest.decode().splitlines())]
    assert [r["sequence"] for r in records] == list(range(1, 1_102))
    assert records[-1]["at"] == 20_000
