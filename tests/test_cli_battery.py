"""Every subcommand, given bad input, answers with one coded line and changes no store.

The battery runs each subcommand of `build_parser()` (found by walking the
parser, so a new command is covered automatically, and
`test_every_subcommand_has_a_battery_entry` fails until it has bad inputs
below) with missing and unreadable files, directories given for files,
bytes that are not UTF-8 in files and arguments, the wrong format (JSON
Lines for JSON, broken TOML, a text file as a SQLite store), unknown names,
outputs that cannot be written (a path under a regular file, or under
`/proc`: the suite runs as root, for whom a read-only directory is no
obstacle), unknown URLs and schemes. Each invocation runs in-process through
`main(argv)`; a few run as real processes too. For every one:

- standard error's first line is `CODE: message`, with no traceback anywhere;
- the code is in the shipped catalogue, and is the expected one where the
  input has a specific code;
- the exit status is the documented one (1 refused, 2 usage);
- the store given to the command is byte for byte and instant for instant
  what it was, and no file appeared beside it or anywhere in the battery's
  folder (a reader of a write-ahead-logged SQLite file may leave its -wal and
  -shm side files; nothing else).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from support import CAPS, request
from support import authority as authority_over
from workwarden.cli import COMMAND_LINE_CODES, build_parser, main
from workwarden.migrate import export_workloads
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.spec import default_spec, shipped_spec_text
from workwarden.storage import AuditRecord, IndexFields, SQLiteStore, StoreFailure
from workwarden.storage.urls import open_store

CATALOGUE = default_spec().errors
_INDEX = IndexFields(tenant="t", application="a", state="READY", priority=0, created_at=0)


def _audit(key: str) -> AuditRecord:
    return AuditRecord("tx", key, 0, "actor", "write", "t", "a", 0, "digest")


CODED_LINE = re.compile(r"^[A-Z][A-Z_]+: .+")
ADAPTER = f"{shlex.quote(sys.executable)} -m workwarden.adapter"

#: Not UTF-8: what Python makes of the byte 0xFF in an argument (`surrogateescape`).
NOT_UTF8_ARG = "\udcff"
#: Outputs nobody can write: under a regular file, and under /proc.
UNDER_A_FILE = "/etc/passwd/out"
UNDER_PROC = "/proc/workwarden-battery/out"


@dataclass(frozen=True)
class Bad:
    """One bad invocation: its arguments, the statuses allowed, the code expected (if one is).

    Arguments name the battery's files by placeholder: `{store}` (a SQLite
    store holding two workloads), `{missing}` (no such file), `{dir}` (a
    directory), `{binary}` (bytes that are not UTF-8), `{jsonl}` (two JSON
    lines, not one JSON value and not an export), `{text}` (a line of
    text), `{toml}` (broken TOML), `{export}` (a valid export), `{trace}`
    (a JSON object that is not a checker trace), `{deep}` (100,000 nested
    `[`), `{fifo}` (a FIFO), `{evil}` (a spec named `../../evil`),
    `{huge}` (an export line at version 2**63 - 1), `{later}` (the store's
    own export, one workload at a later version), `{many}` (a trace whose
    universe has `"workers": "many"`), `{legion}` (a trace whose universe has a billion
    workers), `{empty_trace}` (a trace of no steps),
    `{untakeable}` (a trace whose first step is a call by a worker that holds nothing).
    """

    argv: tuple[str, ...]
    status: int = 1
    code: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        env = "".join(f"{k}={v} " for k, v in self.env.items())
        return env + " ".join(self.argv).encode("utf-8", "backslashreplace").decode()


def bad(*argv: str, status: int = 1, code: str | None = None, **env: str) -> Bad:
    return Bad(tuple(argv), status, code, env)


URL_INVALID = "WORKLOAD_STORE_URL_INVALID"
NOT_FOUND = "WORKLOAD_STORE_NOT_FOUND"
UNUSABLE = "WORKLOAD_STORE_UNUSABLE"
USAGE = "WORKWARDEN_USAGE"
UNREADABLE = "WORKWARDEN_INPUT_UNREADABLE"
UNWRITABLE = "WORKWARDEN_OUTPUT_UNWRITABLE"
SPEC_INVALID = "WORKLOAD_SPEC_INVALID"
INVALID = "WORKLOAD_INVALID"


#: A worker on the battery's store, to which a bad option is added.
WORKER = ("worker", "--store", "{store}", "--app", "x:y", "--tenant", "t", "--application", "a")


def _bad_stores(*head: str, tail: tuple[str, ...] = ()) -> list[Bad]:
    """The bad stores every command with `--store` must refuse in one way."""
    return [
        bad(*head, "--store", "{missing}", *tail, code=NOT_FOUND),
        bad(*head, "--store", "{text}", *tail, code=UNUSABLE),
        bad(*head, "--store", "{dir}", *tail, code=UNUSABLE),
        bad(*head, "--store", "bogus://x", *tail, code=URL_INVALID),
        bad(*head, "--store", "sqlite://host/work.db", *tail, code=URL_INVALID),
        bad(*head, "--store", "sqlite:///x.db?cache=shared", *tail, code=URL_INVALID),
        bad(*head, "--store", "postgresql://[broken", *tail, code=URL_INVALID),
        bad(*head, *tail, code=URL_INVALID, WORKWARDEN_STORE="bogus://x"),
        bad(*head, *tail, code=NOT_FOUND, WORKWARDEN_STORE="{missing}"),
        bad(*head, "--store", NOT_UTF8_ARG, *tail, status=2, code=USAGE),
    ]


#: Subcommand (as typed) -> its bad invocations.
BATTERY: dict[str, list[Bad]] = {
    "inspect": [
        *_bad_stores("inspect", tail=("some-id",)),
        bad("inspect", "--store", "{store}", "no-such-workload", code="WORKLOAD_NOT_FOUND"),
        bad("inspect", "--store", "{store}", NOT_UTF8_ARG, status=2, code=USAGE),
        # An id is a name, as `Authority.get` takes it: not empty, no control
        # character, at most 256 characters.
        bad("inspect", "--store", "{store}", "", code=INVALID),
        bad("inspect", "--store", "{store}", "a\x1bb", code=INVALID),
        bad("inspect", "--store", "{store}", "w" * 257, code=INVALID),
        bad("inspect", "--store", "{store}", status=2, code=USAGE),
        bad("inspect", "some-id", code=URL_INVALID),
    ],
    "list": [
        *_bad_stores("list", tail=("t", "app")),
        bad("list", "--store", "{store}", "--state", "DONE", "t", "app", status=2, code=USAGE),
        bad("list", "--store", "{store}", "--state", "", "t", "app", status=2, code=USAGE),
        bad("list", "--store", "{store}", "t", status=2, code=USAGE),
        bad("list", "--store", "{store}", "t", "app", "extra", status=2, code=USAGE),
        # Names, as `stats --tenant` takes them: not an empty one, nor a control
        # character the "no workloads" line would send to the terminal.
        bad("list", "--store", "{store}", "", "app", code=INVALID),
        bad("list", "--store", "{store}", "t", "", code=INVALID),
        bad("list", "--store", "{store}", "\x1b[31m", "app", code=INVALID),
        bad("list", "--store", "{store}", "t", "a\nb", code=INVALID),
    ],
    "stats": [
        *_bad_stores("stats"),
        bad("stats", "--store", "{store}", "--now", "soon", status=2, code=USAGE),
        bad("stats", "--store", "{store}", "--now", "-1", status=2, code=USAGE),
        bad("stats", "--store", "{store}", "--now", str(2**53), status=2, code=USAGE),
        bad("stats", "--store", "{store}", "--tenant", "", code=INVALID),
        # SQLite's busy timeout is a C int of ms; and more digits than Python reads at once.
        bad("stats", "--store", "sqlite://{store}?busy_timeout_ms=2147483648", code=URL_INVALID),
        bad("stats", "--store", "sqlite://{store}?busy_timeout_ms=" + "9" * 5000, code=URL_INVALID),
        bad("stats", "--store", "{store}", "--bogus", status=2, code=USAGE),
    ],
    "audit": [
        *_bad_stores("audit"),
        bad("audit", "--store", "{store}", "--after", "-1", status=2, code=USAGE),
        bad("audit", "--store", "{store}", "--after", str(2**63), status=2, code=USAGE),
        bad("audit", "--store", "{store}", "--limit", "0", status=2, code=USAGE),
        bad("audit", "--store", "{store}", "--workload", "", code=INVALID),
        bad("audit", "--store", "{store}", "--workload", "a\x01b", code=INVALID),
    ],
    "export": [
        *_bad_stores("export"),
        bad("export", "--store", "{store}", "--out", UNDER_A_FILE, code=UNWRITABLE),
        bad("export", "--store", "{store}", "--out", UNDER_PROC, code=UNWRITABLE),
        bad("export", "--store", "{store}", "--out", "{dir}", code=UNWRITABLE),
        bad("export", "--store", "{store}", "--out", "{fifo}", code=UNWRITABLE),
        # The store's own file, which the export would replace.
        bad("export", "--store", "{store}", "--out", "{store}", code=UNWRITABLE),
    ],
    "import": [
        *_bad_stores("import", tail=("{export}",)),
        bad("import", "--store", "{store}", "{missing}", code=UNREADABLE),
        bad("import", "--store", "{store}", "{dir}", code=UNREADABLE),
        bad("import", "--store", "{store}", "{binary}", code=UNREADABLE),
        bad("import", "--store", "{store}", "{jsonl}", code=INVALID),
        bad("import", "--store", "{store}", "{text}", code=INVALID),
        bad("import", "--store", "{store}", "{trace}", code=INVALID),
        bad("import", "--store", "{store}", "{deep}", code=INVALID),
        bad("import", "--store", "{store}", "{huge}", code=INVALID),
        bad("import", "--store", "{store}", "{later}", code="WORKLOAD_MIGRATION_CONFLICT"),
        bad("import", "--store", "{store}", "--spec", "{toml}", "{export}", code=SPEC_INVALID),
        bad("import", "--store", "{store}", "--spec", "{binary}", "{export}", code=SPEC_INVALID),
        bad("import", "--store", "{text}", "--create", "{export}", code=UNUSABLE),
        bad("import", "--store", UNDER_A_FILE, "--create", "{export}", code=NOT_FOUND),
        bad("import", "--store", "{missing}", "--create", "{jsonl}", code=INVALID),
        bad("import", "--store", "{store}", status=2, code=USAGE),
    ],
    "spec schema": [bad("spec", "schema", "extra", status=2, code=USAGE)],
    "spec examples": [bad("spec", "examples", "pause", status=2, code=USAGE)],
    "spec validate": [
        bad("spec", "validate", "{missing}", code=SPEC_INVALID),
        bad("spec", "validate", "{dir}", code=SPEC_INVALID),
        bad("spec", "validate", "{binary}", code=SPEC_INVALID),
        bad("spec", "validate", "{toml}", code=SPEC_INVALID),
        bad("spec", "validate", "{text}", code=SPEC_INVALID),
        bad("spec", "validate", NOT_UTF8_ARG, status=2, code=USAGE),
        bad("spec", "validate", status=2, code=USAGE),
    ],
    "spec show": [
        bad("spec", "show", "{missing}", code=SPEC_INVALID),
        bad("spec", "show", "{binary}", code=SPEC_INVALID),
        bad("spec", "show", "{toml}", code=SPEC_INVALID),
    ],
    "chaos": [
        bad("chaos", "--store", "memory:", code=URL_INVALID),
        bad("chaos", "--store", "bogus://x", code=URL_INVALID),
        bad("chaos", "--store", "{text}", code=UNUSABLE),
        bad("chaos", "--store", "{store}", code=UNUSABLE),
        bad("chaos", "--store", UNDER_A_FILE, code=NOT_FOUND),
        bad("chaos", code=URL_INVALID),
        bad("chaos", "--store", "{store}", "--workloads", "0", status=2, code=USAGE),
        bad("chaos", "--store", "{store}", "--seconds", "-1", status=2, code=USAGE),
        bad("chaos", "--store", "{store}", "--drain-seconds", "nan", status=2, code=USAGE),
        bad("chaos", "--store", "{missing}", "--batched-workers", "9", code=INVALID),
        bad("chaos", "--store", "{missing}", "--workers", "65", status=2, code=USAGE),
        bad("chaos", "--store", "{missing}", "--seconds", "86401", status=2, code=USAGE),
    ],
    # -- commands whose modules are kept elsewhere: the same contract ----------------------
    "check": [
        bad("check", "--mutant", "no-such-mutant", "--max-states", "5", code=INVALID),
        bad("check", "{missing}", code=SPEC_INVALID),
        bad("check", "{binary}", code=SPEC_INVALID),
        bad("check", "--json", UNDER_A_FILE, "--max-states", "5"),
        # An empty path (an unset variable in a script) names no file: never ignored.
        bad("check", "--json", "", "--max-states", "5", code=UNWRITABLE),
        bad("check", "--mutant", "", "--max-states", "5", code=INVALID),
        bad("check", "--scheduling", "--mutant", "", "--max-states", "5", code=INVALID),
        bad("check", "--scheduling", "--json", "", "--max-states", "5", code=UNWRITABLE),
        bad("check", "--trace-dir", UNDER_A_FILE, "--max-states", "5", code=UNWRITABLE),
        bad("check", "--trace-dir", UNDER_PROC, "--max-states", "5", code=UNWRITABLE),
        bad("check", "--scheduling", "--trace-dir", UNDER_A_FILE, code=UNWRITABLE),
        bad("check", "--workers", "many", status=2, code=USAGE),
        *(
            bad("check", option, value, status=2, code=USAGE)
            for option, value in [
                ("--workloads", "0"),
                ("--workers", "0"),
                ("--workers", "-1"),
                ("--horizon-ms", "-1"),
                ("--rearms", "-1"),
                ("--crashes", "-1"),
                ("--max-states", "0"),
                ("--max-states", "-1"),
                # Past what a universe can be: a state's key is the least over every
                # order of the workers (9! orders outgrow a machine's memory before the
                # first state), and a million workloads would take hours to seed.
                ("--workers", "9"),
                ("--workers", "27"),
                ("--workers", "1200000"),
                ("--workloads", "1000000"),
                ("--rearms", "101"),
                ("--horizon-ms", "1000001"),
            ]
        ),
        bad("check", "--samples", "10000000000", code=INVALID),
        bad("check", "--processes", "100000", code=INVALID),
        bad("check", "{evil}", "--json", "report.json", code=SPEC_INVALID),
    ],
    "replay": [
        bad("replay", "{missing}", code=UNREADABLE),
        bad("replay", "{dir}", code=UNREADABLE),
        bad("replay", "{binary}", code=UNREADABLE),
        bad("replay", "{jsonl}"),
        bad("replay", "{text}"),
        bad("replay", "{trace}"),
        bad("replay", "{deep}", code=INVALID),
        bad("replay", "{many}", code=INVALID),
        bad("replay", "{legion}", code=INVALID),
        bad("replay", "{untakeable}", code=INVALID),
        bad("replay", "{empty_trace}", "--mutant", "", code=INVALID),
        bad("replay", "{empty_trace}", "--store", "{store}", code=UNUSABLE),
        bad("replay", status=2, code=USAGE),
    ],
    "demo": [
        bad("demo", "--store", "bogus://x", "--workloads", "5", code=URL_INVALID),
        bad("demo", "--store", "{text}", "--workloads", "5", code=UNUSABLE),
        bad("demo", "--store", "sqlite://host/x.db", "--workloads", "5", code=URL_INVALID),
        bad("demo", "--workloads", "5", "--out-dir", UNDER_A_FILE, code=UNWRITABLE),
        bad("demo", "--workloads", "many", status=2, code=USAGE),
        # Out of range is a usage error, before any store is opened (a fleet of 100,000
        # threads cannot be started).
        bad("demo", "--store", "{store}", "--workers", "65", status=2, code=USAGE),
        bad("demo", "--store", "{store}", "--workers", "100000", status=2, code=USAGE),
        bad("demo", "--store", "{store}", "--workloads", "1000001", status=2, code=USAGE),
        bad("demo", "--store", "{store}", "--workloads", "5", code=UNUSABLE),
        bad("demo", "--store", "{store}", "--out-dir", "{dir}/new/deeper", code=UNUSABLE),
    ],
    "diagram": [
        bad("diagram", "{missing}", code=SPEC_INVALID),
        bad("diagram", "{binary}", code=SPEC_INVALID),
        bad("diagram", "{toml}", code=SPEC_INVALID),
        bad("diagram", "--out-dir", UNDER_A_FILE),
        bad("diagram", "--format", "bogus"),
        bad("diagram", "--history", "bogus://x", "some-id", code=URL_INVALID),
        bad("diagram", "--history", "{missing}", "some-id", code=NOT_FOUND),
        bad("diagram", "--history", "{text}", "some-id", code=UNUSABLE),
        bad("diagram", "--history", "{store}", "no-such-workload", code="WORKLOAD_NOT_FOUND"),
        bad("diagram", "--report", "{missing}", code=UNREADABLE),
        bad("diagram", "--report", "{dir}", code=UNREADABLE),
        bad("diagram", "--report", "{binary}", code=UNREADABLE),
        bad("diagram", "--report", "{jsonl}", code=INVALID),
        bad("diagram", "--report", "{deep}", code=INVALID),
        bad("diagram", "--report", "", "--out-dir", "{dir}/x/dg", code=UNREADABLE),
        bad("diagram", "--out-dir", "", code="DIAGRAM_WRITE_FAILED"),
        bad("diagram", "{evil}", "--out-dir", "{dir}/x/dg", code=SPEC_INVALID),
        *(
            bad("diagram", "--name", name, "--out-dir", "{dir}/x/dg", code="DIAGRAM_INPUT_INVALID")
            for name in ("../../x", "a/b", "", ".hidden", "two\nlines")
        ),
    ],
    "schema": [
        bad("schema", "no-such-schema", code=INVALID),
        bad("schema", "--out", UNDER_A_FILE),
        bad("schema", "--out", "{dir}/nope/deeper", code=UNWRITABLE),
        bad("schema", "workload", "--out", "{dir}/schemas", status=2, code=USAGE),
    ],
    "vectors": [
        bad("vectors", "--spec", "{missing}", code=SPEC_INVALID),
        bad("vectors", "--spec", "{toml}", code=SPEC_INVALID),
        bad("vectors", "--spec", "{evil}", "--out", "{dir}/", code=SPEC_INVALID),
        bad("vectors", "--out", "{dir}/nope/deeper/x.jsonl", code=UNWRITABLE),
        bad("vectors", "--out", "{dir}/nope/deeper/", code=UNWRITABLE),
        bad("vectors", "--out", "", code=UNWRITABLE),
    ],
    "conform": [
        bad("conform", "--cmd", "no-such-program-here", code="CONFORMANCE_PROGRAM_UNUSABLE"),
        bad("conform", "--cmd", ADAPTER, "--vectors", "{missing}", code=UNREADABLE),
        bad("conform", "--cmd", ADAPTER, "--vectors", "{dir}", code=UNREADABLE),
        bad("conform", "--cmd", ADAPTER, "--vectors", "{binary}", code=UNREADABLE),
        bad("conform", "--cmd", ADAPTER, "--junit", "{dir}/nope/x.xml", code=UNWRITABLE),
        bad("conform", "--cmd", ADAPTER, "--timeout", "inf", status=2, code=USAGE),
        bad("conform", "--cmd", ADAPTER, "--timeout", "0", status=2, code=USAGE),
        bad("conform", "--cmd", ADAPTER, "--vectors", "{jsonl}"),
        bad("conform", "--cmd", ADAPTER, "-k", "no-such-scenario", "--junit", UNDER_A_FILE),
        bad("conform", "--cmd", ADAPTER, "--timeout", "soon", status=2, code=USAGE),
        bad("conform", "--cmd", 'unterminated "quote', code=INVALID),
        # Nothing run is not a pass: a -k that matches nothing, an empty vector file.
        bad("conform", "--cmd", ADAPTER, "-k", "no-such-scenario", code=INVALID),
        bad("conform", "--cmd", ADAPTER, "--vectors", "{empty_file}", code=INVALID),
    ],
    "worker": [
        bad(
            "worker",
            "--store",
            "bogus://x",
            "--app",
            "no_such_module:app",
            "--tenant",
            "t",
            "--application",
            "a",
        ),
        bad("worker", "--app", "x:y", "--tenant", "t", status=2, code=USAGE),
        bad(
            "worker",
            "--app",
            "x:y",
            "--tenant",
            "t",
            "--application",
            "a",
            "--concurrency",
            "0",
            status=2,
            code=USAGE,
        ),
        bad(
            "worker",
            "--store",
            "{store}",
            "--warden",
            "http://127.0.0.1:9",
            "--token",
            "x",
            "--app",
            "x:y",
            "--tenant",
            "t",
            "--application",
            "a",
            status=2,
            code=USAGE,
        ),
        bad(
            "worker",
            "--warden",
            "ftp://x",
            "--token",
            "x",
            "--app",
            "x:y",
            "--tenant",
            "t",
            "--application",
            "a",
            status=2,
            code=USAGE,
        ),
        *(
            bad(*WORKER, option, value, status=2, code=USAGE)
            for option, value in [
                ("--metrics-port", "0"),
                ("--metrics-port", "70000"),
                ("--lease-ms", "9223372036854775807"),
                ("--lease-ms", str(2**53 - 1)),
                ("--batch-window-ms", "99999999999999999999"),
                ("--grace-s", "-1"),
                ("--grace-s", "inf"),
                ("--grace-s", "nan"),
            ]
        ),
        bad(*WORKER[:4], "../tasks:app", *WORKER[5:], code=INVALID),
        *(
            bad("worker", "--warden", url, "--token", "x", *WORKER[3:], status=2, code=USAGE)
            for url in ["http://[::1", "http://warden:port", "http://u:p@w:0"]
        ),
    ],
    "sweeper": [
        bad(
            "sweeper", "--store", "{store}", "--warden", "http://127.0.0.1:9", status=2, code=USAGE
        ),
        bad("sweeper", "--token", "x", "--store", "{store}", status=2, code=USAGE),
        # A --warden URL no service can be reached at: refused at once, not a bug later.
        *(
            bad("sweeper", "--warden", url, "--token", "x", status=2, code=USAGE)
            for url in [
                "http://[::1",
                "http://warden:port",
                "http://:99999",
                "http://",
                "http:// h",
            ]
        ),
        bad("sweeper", "--store", "bogus://x", code=URL_INVALID),
        bad("sweeper", "--store", "{missing}", code=NOT_FOUND),
        bad("sweeper", "--store", "{text}", code=UNUSABLE),
        bad("sweeper", code=URL_INVALID),
        bad("sweeper", "--bogus", status=2, code=USAGE),
        bad("sweeper", "--store", "{store}", "--metrics-port", "70000", status=2, code=USAGE),
        # Refused before --create makes the store: no file is left behind.
        bad("sweeper", "--store", "{missing}", "--create", "--tenant", "", code=INVALID),
        bad("sweeper", "--store", "{missing}", "--create", "--spec", "{toml}", code=SPEC_INVALID),
    ],
    "scheduler": [
        bad("scheduler", "--store", "bogus://x", "--schedules", "x:y", "--no-grant-signatures"),
        # The schedules are read before the store is opened, as a worker's app is.
        bad(
            "scheduler",
            "--store",
            "{missing}",
            "--schedules",
            "x:y",
            "--no-grant-signatures",
            code=INVALID,
        ),
        bad(
            "scheduler",
            "--store",
            "{store}",
            "--schedules",
            "no_such_module_here:schedules",
            "--no-grant-signatures",
            code=INVALID,
        ),
        bad(
            "scheduler",
            "--store",
            "{store}",
            "--schedules",
            "nocolon",
            "--no-grant-signatures",
            code=INVALID,
        ),
        bad("scheduler", "--store", "{store}", "--schedules", "x:y", status=2, code=USAGE),
        bad(
            "scheduler",
            "--store",
            "{store}",
            "--schedules",
            "x:y",
            "--grant-keys",
            "{missing}",
            code=UNREADABLE,
        ),
        bad("scheduler", "--schedules", "x:y", "--poll-s", "0", status=2, code=USAGE),
        bad("scheduler", "--bogus", status=2, code=USAGE),
        bad(
            "scheduler",
            "--store",
            "{store}",
            "--schedules",
            "../tasks:schedules",
            "--no-grant-signatures",
            code=INVALID,
        ),
        # Bad schedules are refused before the store is opened: --create leaves no file.
        bad(
            "scheduler",
            "--store",
            "{missing}",
            "--create",
            "--schedules",
            "no_such_module_here:schedules",
            "--no-grant-signatures",
            code=INVALID,
        ),
    ],
    "pause": [
        *_bad_stores("pause", tail=("--tenant", "t", "--actor", "ops")),
        bad("pause", "--store", "{store}", "--actor", "ops", status=2, code=USAGE),
        bad("pause", "--store", "{store}", "--tenant", "t", status=2, code=USAGE),
        bad(
            "pause",
            "--store",
            "{store}",
            "--tenant",
            "t",
            "--definition",
            "send",
            "--actor",
            "ops",
            code=INVALID,
        ),
        bad(
            "pause",
            "--store",
            "{store}",
            "--tenant",
            "t",
            "--actor",
            "ops",
            "--reason",
            "sk-live-key",
            code="WORKLOAD_SECRET_REJECTED",
        ),
        bad("pause", "--tenant", "t", "--actor", "ops", "--now", "soon", status=2, code=USAGE),
        bad("pause", "--tenant", "t", "--actor", "ops", "--now", "-1", status=2, code=USAGE),
    ],
    "resume": [
        *_bad_stores("resume", tail=("--tenant", "t", "--actor", "ops")),
        bad("resume", "--store", "{store}", "--tenant", "", "--actor", "ops", code=INVALID),
        bad("resume", "--bogus", status=2, code=USAGE),
        bad("resume", "--tenant", "t", "--actor", "ops", "--now", str(2**53), status=2, code=USAGE),
    ],
    "pauses": [
        *_bad_stores("pauses"),
        bad("pauses", "--store", "{store}", "--tenant", "", code=INVALID),
    ],
    "purge": [
        *_bad_stores("purge"),
        bad("purge", "--store", "{store}", "--older-than", "soon", status=2, code=USAGE),
        bad("purge", "--store", "{store}", "--spec", "{missing}", code=SPEC_INVALID),
        bad("purge", "--store", "{store}", "--export", UNDER_A_FILE, code=UNWRITABLE),
        # The store's own file, which lines appended to would corrupt.
        bad("purge", "--store", "{store}", "--export", "{store}", code=UNWRITABLE),
        bad("purge", "--store", "{store}", "--actor", "", code=INVALID),
        # An instant out of range is a usage error, as for `stats --now`.
        bad("purge", "--store", "{store}", "--now", "-1", status=2, code=USAGE),
        bad("purge", "--store", "{store}", "--now", str(2**53), status=2, code=USAGE),
    ],
    "serve": [
        bad("serve", "--store", "memory:", "--token-keys", "{missing}", code=UNREADABLE),
        bad("serve", "--store", "memory:", "--token-keys", "{binary}", code=UNREADABLE),
        bad("serve", "--store", "memory:", "--token-keys", "{jsonl}"),
        bad("serve", "--store", "memory:", "--token-keys", "{dir}", code=UNREADABLE),
        bad("serve", "--token-keys", "{missing}", "--port", "0", status=2, code=USAGE),
        bad("serve", "--token-keys", "{missing}", "--port", "99999", status=2, code=USAGE),
        bad("serve", "--token-keys", "{missing}", "--port", "65536", status=2, code=USAGE),
        bad("serve", "--store", "memory:", status=2, code=USAGE),
    ],
    "validate-history": [
        bad("validate-history", "{missing}", code=UNREADABLE),
        bad("validate-history", "{dir}", code=UNREADABLE),
        bad("validate-history", "{binary}", code=UNREADABLE),
        bad("validate-history", "{text}"),
        bad("validate-history", "{deep}", code=INVALID),
        bad("validate-history", "--store", "bogus://x", code=URL_INVALID),
        bad("validate-history", "--store", "{missing}", code=NOT_FOUND),
        bad("validate-history", "--store", "{text}", code=UNUSABLE),
        bad("validate-history", status=2, code=USAGE),
    ],
}

CASES = [(command, case) for command, cases in BATTERY.items() for case in cases]


def _subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[str]:
    """Every leaf subcommand of `parser`, as typed (`spec validate`)."""
    found = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = True
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix} {name}".strip())
    if not found and prefix:
        yield prefix


def test_every_subcommand_has_a_battery_entry() -> None:
    commands = set(_subcommands(build_parser()))
    assert commands - set(BATTERY) == set(), "subcommands with no bad inputs in the battery"
    assert set(BATTERY) - commands == set(), "battery entries for commands that do not exist"


def test_every_command_line_code_is_in_the_catalogue_with_a_class() -> None:
    for code in COMMAND_LINE_CODES:
        assert code in CATALOGUE, code
        assert CATALOGUE[code].meaning.strip(), code
    for _, case in CASES:
        if case.code is not None:
            assert case.code in CATALOGUE, case


# -- the battery's files -----------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files the placeholders name, in a folder of their own."""
    root = tmp_path_factory.mktemp("battery")
    store_path = root / "store.db"
    with closing(SQLiteStore(store_path)) as store:
        authority = authority_over(store)
        wid = authority.admit(request(), now=10_000).workload.workload_id
        authority.claim(wid, "w", CAPS, now=11_000, lease_ms=1_000)
        authority.admit(request(idempotency_key="two"), now=10_500)
        with (root / "export.jsonl").open("w", encoding="ascii") as out:
            export_workloads(store, out)
    (root / "dir").mkdir()
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00 not text \xc3\x28\n")
    (root / "lines.jsonl").write_text('{"a": 1}\n{"b": 2}\n', encoding="utf-8")
    (root / "text.txt").write_text("just a line of text\n", encoding="utf-8")
    (root / "broken.toml").write_text("[spec\nname = \n", encoding="utf-8")
    (root / "trace.json").write_text(json.dumps({"steps": "not a list"}), encoding="utf-8")
    (root / "deep.json").write_text("[" * 100_000, encoding="utf-8")
    os.mkfifo(root / "fifo")
    evil = shipped_spec_text().replace('name = "workload"', 'name = "../../evil"', 1)
    (root / "evil.toml").write_text(evil, encoding="utf-8")
    first, *rest = (root / "export.jsonl").read_text(encoding="ascii").splitlines()
    line = json.loads(first)
    (root / "huge.jsonl").write_text(json.dumps({**line, "version": 2**63 - 1}) + "\n")
    later = [json.dumps({**line, "version": line["version"] + 1}), *rest]
    (root / "later.jsonl").write_text("\n".join(later) + "\n", encoding="ascii")
    many = {"universe": {"workers": "many"}, "steps": []}
    (root / "many.json").write_text(json.dumps(many), encoding="utf-8")
    legion = {"universe": {"workers": 10**9}, "steps": []}
    (root / "legion.json").write_text(json.dumps(legion), encoding="utf-8")
    (root / "empty_trace.json").write_text(json.dumps({"universe": {}, "steps": []}))
    untakeable = {"universe": {}, "steps": [{"action": "start", "slot": 0, "worker": 0}]}
    (root / "untakeable.json").write_text(json.dumps(untakeable), encoding="utf-8")
    (root / "empty.jsonl").write_text("", encoding="ascii")
    return {
        "root": str(root),
        "store": str(store_path),
        "missing": str(root / "no-such-file.db"),
        "dir": str(root / "dir"),
        "binary": str(root / "binary.txt"),
        "jsonl": str(root / "lines.jsonl"),
        "text": str(root / "text.txt"),
        "toml": str(root / "broken.toml"),
        "export": str(root / "export.jsonl"),
        "trace": str(root / "trace.json"),
        "deep": str(root / "deep.json"),
        "fifo": str(root / "fifo"),
        "evil": str(root / "evil.toml"),
        "huge": str(root / "huge.jsonl"),
        "later": str(root / "later.jsonl"),
        "many": str(root / "many.json"),
        "legion": str(root / "legion.json"),
        "empty_trace": str(root / "empty_trace.json"),
        "untakeable": str(root / "untakeable.json"),
        "empty_file": str(root / "empty.jsonl"),
    }


def _filled(text: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


def _fingerprint(files: dict[str, str]) -> dict[str, tuple[bytes, int]]:
    """Every file of the battery's folder, by name: its bytes and modification instant
    (for a directory or a FIFO, its modification instant alone).

    The -wal and -shm files a reader of the store may leave are not part of it.
    """
    out = {}
    for path in sorted(Path(files["root"]).rglob("*")):
        if path.name.endswith(("-wal", "-shm")):
            continue
        data = path.read_bytes() if path.is_file() else b""
        out[str(path)] = (data, path.lstat().st_mtime_ns)
    return out


def _assert_one_coded_line(case: Bad, status: int, err: str) -> None:
    assert "Traceback" not in err, f"{case}: {err}"
    first = err.splitlines()[0] if err else ""
    assert CODED_LINE.match(first), f"{case}: first line of stderr: {first!r}"
    code = first.split(":", 1)[0]
    assert code in CATALOGUE, f"{case}: {code} is not in the catalogue"
    if case.code is not None:
        assert code == case.code, f"{case}: {first}"
    assert status == case.status, f"{case}: exit status {status}, stderr {first!r}"


@pytest.mark.parametrize(("command", "case"), CASES, ids=[str(case) for _, case in CASES])
def test_a_bad_invocation_prints_one_coded_line_and_changes_nothing(
    command: str,
    case: Bad,
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORKWARDEN_STORE", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, _filled(value, files))
    monkeypatch.chdir(files["root"])
    before = _fingerprint(files)

    status = main([_filled(arg, files) for arg in case.argv])

    err = capsys.readouterr().err
    _assert_one_coded_line(case, status, err)
    assert _fingerprint(files) == before, f"{case} changed the battery's files"


# -- as real processes ---------------------------------------------------------------------


def _run(argv: list[str | bytes], cwd: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    environ = {k: v for k, v in os.environ.items() if k != "WORKWARDEN_STORE"} | env
    return subprocess.run(
        [sys.executable, "-m", "workwarden", *argv],
        capture_output=True,
        cwd=cwd,
        env=environ,
        timeout=120,
        check=False,
    )


PROCESS_CASES: list[tuple[list[str | bytes], int, str, dict[str, str]]] = [
    (["inspect", "--store", "{store}", b"\xff\xfe"], 2, USAGE, {}),
    (["list", "t", "app"], 1, URL_INVALID, {"WORKWARDEN_STORE": "bogus://x"}),
    (["export", "--store", "{store}", "--out", UNDER_A_FILE], 1, UNWRITABLE, {}),
    (["import", "--store", "{missing}", "{export}"], 1, NOT_FOUND, {}),
    (["stats", "--store", "{text}"], 1, UNUSABLE, {}),
    ([], 2, USAGE, {}),
    (["no-such-command"], 2, USAGE, {}),
]


@pytest.mark.parametrize(("argv", "status", "code", "env"), PROCESS_CASES)
def test_a_bad_invocation_of_the_installed_command_prints_one_coded_line(
    argv: list[str | bytes], status: int, code: str, env: dict[str, str], files: dict[str, str]
) -> None:
    filled = [_filled(a, files) if isinstance(a, str) else a for a in argv]
    before = _fingerprint(files)
    done = _run(filled, files["root"], **env)
    err = done.stderr.decode("utf-8", "replace")
    case = Bad(tuple(str(a) for a in argv), status, code)
    _assert_one_coded_line(case, done.returncode, err)
    assert done.stdout == b""
    assert _fingerprint(files) == before


def test_a_postgresql_server_that_cannot_be_reached_is_one_coded_line(
    files: dict[str, str],
) -> None:
    """libpq's reason comes over two lines, its hint indented; the command's line stays one.

    And the pool's own warnings, if it logs any while it tries, are `library_log` lines.
    """
    done = _run(["stats", "--store", "postgresql://postgres@127.0.0.1:1/none"], files["root"])
    assert done.returncode == 1
    lines = done.stderr.decode("utf-8", "replace").splitlines()
    coded = [line for line in lines if not line.startswith("library_log ")]
    assert len(coded) == 1, lines
    assert coded[0].startswith("WORKLOAD_STORAGE_FAILURE: cannot open the PostgreSQL store")
    assert "Is the server running" in coded[0]


#: U+009B, the C1 control sequence introducer: a name may hold it (only C0 controls and
#: DEL are refused), and a terminal may take it for ESC [.
CSI = "\u009b"


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--store", "{store}", f"x{CSI}2J", "app"],
        ["stats", "--store", "{store}", "--tenant", f"x{CSI}2J"],
        ["audit", "--store", "{store}", "--workload", f"x{CSI}2J"],
    ],
)
def test_a_line_that_repeats_an_argument_prints_its_control_characters_escaped(
    argv: list[str], files: dict[str, str]
) -> None:
    done = _run([_filled(a, files) for a in argv], files["root"])
    assert done.returncode == 0, done.stderr
    assert CSI.encode() not in done.stdout
    assert b"x\\x9b2J" in done.stdout
    assert len(done.stdout.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["purge", "--store", "{store}", "--limit", "3"], "workwarden purge"),
        (["resume", "--tenant", "t", "--actor", "ops", "--reason", "why"], "workwarden resume"),
        (["list", "--store", "{store}", "t", "app", "extra"], "workwarden list"),
        (["spec", "show", "a.toml", "b.toml"], "workwarden spec show"),
    ],
)
def test_an_argument_a_command_does_not_take_is_refused_in_that_commands_name(
    argv: list[str], prog: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointing to the command's own `--help`, which lists what it takes, not the top one."""
    assert main([_filled(a, files) for a in argv]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"{USAGE}: {prog}: unrecognized arguments: "), first
    assert first.endswith(f"(see {prog} --help)"), first


def test_the_battery_runs_over_a_hundred_invocations() -> None:
    # The count the project's documentation quotes (docs/cli.md).
    assert len(CASES) + len(PROCESS_CASES) >= 150


def test_an_unexpected_error_is_one_coded_line_asking_for_a_report(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(docs: object) -> None:
        raise RuntimeError("the statistics broke")

    monkeypatch.setattr("workwarden.cli.stats.collect", broken)
    assert main(["stats", "--store", files["store"]]) == 70
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "WORKWARDEN_INTERNAL: unexpected RuntimeError: the statistics broke; this is a bug in"
        " workwarden, please report it with the command line that led to it"
    ]


# -- outputs: through symlinks, never over what is not a file ---------------------------


def test_an_export_through_a_symlink_replaces_the_file_it_names_and_keeps_its_mode(
    files: dict[str, str], tmp_path: Path
) -> None:
    real = tmp_path / "real.jsonl"
    real.write_text("an older export\n", encoding="ascii")
    real.chmod(0o640)
    link = tmp_path / "link.jsonl"
    link.symlink_to(real.name)

    assert main(["export", "--store", files["store"], "--out", str(link)]) == 0

    assert link.is_symlink()
    assert os.readlink(link) == real.name
    assert real.read_text(encoding="ascii") == Path(files["export"]).read_text(encoding="ascii")
    assert real.stat().st_mode & 0o7777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "real.jsonl"]


def test_a_new_output_file_gets_the_mode_the_umask_gives(
    files: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "new.jsonl"
    previous = os.umask(0o027)
    try:
        assert main(["export", "--store", files["store"], "--out", str(out)]) == 0
    finally:
        os.umask(previous)
    assert out.stat().st_mode & 0o7777 == 0o640


def test_an_output_that_is_a_fifo_or_a_socket_is_refused_and_left_as_it_is(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "fifo-link").symlink_to(fifo)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    try:
        for name in ("fifo", "fifo-link", "sock"):
            out = str(tmp_path / name)
            assert main(["export", "--store", files["store"], "--out", out]) == 1
            first = capsys.readouterr().err.splitlines()[0]
            assert first.startswith(f"{UNWRITABLE}: cannot write the export {out}: it is a")
        assert stat.S_ISFIFO(fifo.lstat().st_mode)
        assert stat.S_ISSOCK((tmp_path / "sock").lstat().st_mode)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "fifo-link", "sock"]
    finally:
        listener.close()


# -- a store in a directory the reader cannot write --------------------------------------


#: A process that loads the command line, then, as root, becomes the unprivileged
#: `nobody` (who may not read the interpreter's files under /root) and runs it.
AS_NOBODY = """
import os, sys
from workwarden.cli import build_parser, main
import workwarden.storage.sqlite
build_parser()
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["stats", "--json"], '"total": 2'),
        # A dry run only reads: it needs no more than read access, as `stats` does.
        (["purge", "--dry-run", "--older-than", "0", "--now", "20000"], "would purge 0"),
    ],
)
def test_a_store_in_a_directory_the_reader_cannot_write_is_read_as_it_stands(
    files: dict[str, str], argv: list[str], expected: str
) -> None:
    # As root (CI), the reader is `nobody` in a directory root owns; otherwise the
    # directory is made read-only to its owner, the user running the suite.
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="workwarden-readonly-"))
    try:
        store = folder / "work.db"
        shutil.copyfile(files["store"], store)
        store.chmod(0o644)
        as_root = os.geteuid() == 0
        folder.chmod(0o755 if as_root else 0o555)
        before = store.read_bytes()
        done = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, *argv, "--store", str(store)],
            capture_output=True,
            cwd="/",
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        assert expected in (done.stdout + done.stderr).decode()
        assert store.read_bytes() == before
        assert sorted(p.name for p in folder.iterdir()) == ["work.db"]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)


# -- the resolver every command uses -----------------------------------------------------


def test_the_resolver_creates_a_store_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "work.db"
    for mode in ("read", "write"):
        with pytest.raises(WorkloadError) as refused:
            open_store(str(path), mode=mode)  # type: ignore[arg-type]
        assert refused.value.code == NOT_FOUND
        assert refused.value.details == {"path": str(path)}
        assert not path.exists()
    with closing(open_store(f"sqlite://{path}", mode="create")) as created:
        assert list(created.scan()) == []
    with closing(open_store(str(path), mode="write")):
        pass
    with closing(open_store(str(path), mode="read")) as reader:
        assert isinstance(reader, SQLiteStore)
        assert reader.read_only
        with pytest.raises(StoreFailure):
            reader.write("k", "{}", _INDEX, None, _audit("k"))
    with pytest.raises(WorkloadError) as no_directory:
        open_store(str(tmp_path / "absent" / "work.db"), mode="create")
    assert no_directory.value.code == NOT_FOUND


def test_the_resolver_takes_the_environment_when_given_no_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORKWARDEN_STORE", raising=False)
    with pytest.raises(WorkloadError) as refused:
        open_store(None)
    assert refused.value.code == URL_INVALID
    assert refused.value.error_class == "fix_request"
    monkeypatch.setenv("WORKWARDEN_STORE", f"sqlite:{tmp_path / 'env.db'}")
    with closing(open_store(None, mode="create")) as store:
        assert isinstance(store, SQLiteStore)
    assert (tmp_path / "env.db").exists()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@127.0.0.1:notaport/db",
        "postgresql://user:s3cret@127.0.0.1:99999/db",
        "postgresql://user:s3cret@h1:5432,h2:x/db",
        "postgresql://user:s3cret@127.0.0.1/db?connect_timeout=x",
        "postgresql://user:s3cret@127.0.0.1/db?connect_timeout=--5",
        # More digits than Python reads as a number at once (4,300).
        "postgresql://user:s3cret@127.0.0.1/db?connect_timeout=" + "9" * 5000,
        "postgresql://user:s3cret@127.0.0.1/db?connect_timeout=-" + "9" * 5000,
        "postgresql://user:s3cret@127.0.0.1:" + "9" * 5000 + "/db",
    ],
)
def test_a_postgresql_url_with_a_port_or_timeout_no_server_has_is_refused_at_once(
    url: str,
) -> None:
    """Not tried for the connect timeout as an unreachable server would be: no connection
    can ever be made with it."""
    started = time.monotonic()
    with pytest.raises(WorkloadError) as refused:
        open_store(url)
    assert refused.value.code == URL_INVALID
    assert "s3cret" not in str(refused.value)
    assert time.monotonic() - started < 2


@pytest.mark.postgres
@pytest.mark.parametrize("seconds", ["2147483648", "99999999999"])
def test_a_connect_timeout_longer_than_libpq_takes_is_refused_at_once(seconds: str) -> None:
    """Past libpq's own limit (a C int): on a server that answers, 10**11 s was an internal
    error (no wait that long can be timed), and 2**31 s a wait libpq would never make."""
    from psycopg.conninfo import conninfo_to_dict

    from pg import postgres_database

    with postgres_database() as dsn:
        parts = conninfo_to_dict(dsn)
        url = (
            f"postgresql:///{parts['dbname']}?host={quote(str(parts['host']), safe='')}"
            f"&user={parts['user']}&connect_timeout={seconds}"
        )
        with pytest.raises(WorkloadError) as refused:
            open_store(url, mode="read").close()
    assert refused.value.code == URL_INVALID
    assert "outside libpq's range (at most 2,147,483,647 seconds)" in refused.value.message


def test_a_bad_postgresql_url_is_refused_without_repeating_it() -> None:
    with pytest.raises(WorkloadError) as refused:
        open_store("postgresql://user:s3cret@[broken/db")
    assert refused.value.code == URL_INVALID
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["stats", "--store", "{store}"],
        ["export", "--store", "{store}"],
        ["audit", "--store", "{store}", "--json"],
        ["spec", "examples"],
        ["--help"],
    ],
)
def test_a_closed_standard_output_is_output_unwritable_not_a_bug(
    argv: list[str], files: dict[str, str]
) -> None:
    # Started with `>&-`: Python has no `sys.stdout` at all (None).
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", *(_filled(a, files) for a in argv)],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "WORKWARDEN_OUTPUT_UNWRITABLE: cannot write the output: standard output is closed"
    ]


def test_a_refusal_without_standard_error_is_not_printed_on_standard_output(
    files: dict[str, str],
) -> None:
    # Started with `2>&-`: the refusal has nowhere to go; the exit status still says it.
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", "stats", "--store", files["missing"]],
        stdout=subprocess.PIPE,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(2),
    )
    assert done.returncode == 1
    assert done.stdout == b""


def test_a_command_that_prints_nothing_runs_without_standard_output(
    files: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "export.jsonl"
    argv = ["export", "--store", files["store"], "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "workwarden", *argv],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="ascii") == Path(files["export"]).read_text(encoding="ascii")


@pytest.mark.parametrize(
    "argv", [["vectors"], ["spec", "examples"], ["--version"], ["--help"], ["check", "--help"]]
)
def test_output_to_a_full_device_is_output_unwritable_not_a_bug(argv: list[str]) -> None:
    # /dev/full takes no byte: the write fails with ENOSPC, as on a full disk.
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "workwarden", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "WORKWARDEN_OUTPUT_UNWRITABLE: cannot write the output: No space left on device"
    ]
