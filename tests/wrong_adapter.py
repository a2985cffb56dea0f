"""A deliberately wrong implementation behind the conformance protocol, for `workwarden conform`.

`python tests/wrong_adapter.py MISTAKE` serves the protocol like
`python -m workwarden.adapter`, except for one mistake:

- `budget`: its failure policy has no attempt-budget rule, so a failure is
  retried past the budget;
- `stale-fence`: it ignores stale fences, deciding every fenced call as if
  the current claim's holder had made it;
- `crash`: it exits at its fourth command;
- `hang`: it never answers a `fail` command;
- `lingers`: it answers every request 1.5 s late, and when its input ends it
  leaves a child behind holding its standard output for a second;
- `closes-stdout`: at its first command it closes its standard output and
  lives on without answering;
- `unfenced-OP`: for operation OP only, it checks that a claim is held but not
  that the fence (claim id, worker, token) is the current claim's;
- `lease-unchecked-OP`: for operation OP only, it checks the fence but not
  whether the lease has expired;
- `ignores-request-ids`: it drops the `request_id` of every command;
- `doc-field SPEC`: under the spec file SPEC, its store read-back says a
  running workload was updated 1 ms later than it was;
- `no-input-hash`: its store read-back leaves out every document's `input_hash`;
- `refuses-reset`: it refuses every request with `WORKLOAD_STORAGE_FAILURE`;
- `tie-largest-id`: `claim_next` breaks a tie of priority and age by the
  largest workload id instead of the smallest;
- `codeless-refusal`: where a command's reply is `null` (a `claim_next` that
  finds nothing), it answers an error object without a `code`;
- `null-refusal`: there, it answers `{"error": null}`;
- `answers-twice`: it writes every response line twice;
- `not-utf8`: it answers its first request, then a line that is not UTF-8;
- `endless-line`: it answers its first request, then writes a line that never
  ends (a mebibyte at a time, until it is stopped);
- `endless-stderr`: it writes 100 MiB on standard error without a line break,
  then exits;
- `version-zero`: its store read-back says every document is at version 0;
- `lists-twice`: its store read-back lists every document twice;
- `nested-reply DEPTH`: it answers every command with a reply nested DEPTH deep;
- `long-number`: it answers every command with a number of 5000 digits;
- `lone-surrogate`: it answers every command with a string holding a lone surrogate
  (`"\\ud800"`, an escape that names no character);
- `stops-reading`: it answers a reset and a store read-back (as an empty store), then
  never reads its input again (a request larger than the pipe cannot be written whole);
- `stderr-controls`: at its first command it writes control characters (a NUL, an
  escape sequence) on standard error and exits;
- `store-object`: its store read-back is an object, not a list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from workwarden.adapter import serve
from workwarden.statemachine import core, errors
from workwarden.statemachine.conformance.vectors import ReferenceImplementation
from workwarden.statemachine.models import Claim, Fence, Workload
from workwarden.statemachine.spec import load_spec, load_spec_text, shipped_spec_text
from workwarden.storage import memory

BUDGET_RULE = (
    '  { when = ["budget_exhausted"], decision = "attempt_budget_exhausted", '
    'to = "DEAD_LETTER" },\n'
)


class StaleFencesAccepted(ReferenceImplementation):
    """Presents the current claim's fence in place of whatever fence a call carries."""

    def handle(self, request: Any) -> dict[str, Any]:
        command = request.get("command") if isinstance(request, dict) else None
        if isinstance(command, dict) and "fence" in command:
            doc = self.store.read(str(command.get("workload_id")))
            if doc is not None:
                claim = Workload.model_validate_json(doc.document).current_claim
                if claim is not None:
                    command = {**command, "fence": claim.fence.model_dump(mode="json")}
                    request = {**request, "command": command}
        return super().handle(request)


class Crashes(ReferenceImplementation):
    """Exits with status 3 at its fourth command."""

    commands = 0

    def handle(self, request: Any) -> dict[str, Any]:
        if isinstance(request, dict) and request.get("type") == "command":
            self.commands += 1
            if self.commands == 4:
                print("wrong adapter: giving up", file=sys.stderr, flush=True)
                raise SystemExit(3)
        return super().handle(request)


class Hangs(ReferenceImplementation):
    """Never answers a `fail` command."""

    def handle(self, request: Any) -> dict[str, Any]:
        command = request.get("command") if isinstance(request, dict) else None
        if isinstance(command, dict) and command.get("op") == "fail":
            time.sleep(3600)
        return super().handle(request)


class ClosesStdout(ReferenceImplementation):
    """Closes its standard output at its first command and sleeps on."""

    def handle(self, request: Any) -> dict[str, Any]:
        if isinstance(request, dict) and request.get("type") == "command":
            sys.stdout.flush()
            os.close(1)
            time.sleep(3600)
        return super().handle(request)


class SkipsAFenceCheck(ReferenceImplementation):
    """Skips one part of the fence check (`part`: "fence" or "lease") for one operation."""

    def __init__(self, part: str, op: str) -> None:
        super().__init__()
        real = core._fence
        current: list[Any] = [None]
        self.current = current

        def fence(workload: Workload, given: Fence, now: int) -> Claim:
            if current[0] != op:
                return real(workload, given, now)
            if part == "lease":
                return real(workload, given, -1)
            claim = workload.current_claim
            if claim is None:
                raise errors.WorkloadError(errors.CLAIM_INVALID, "no active claim")
            return claim

        core._fence = fence

    def handle(self, request: Any) -> dict[str, Any]:
        command = request.get("command") if isinstance(request, dict) else None
        self.current[0] = command.get("op") if isinstance(command, dict) else None
        return super().handle(request)


class IgnoresRequestIds(ReferenceImplementation):
    """Drops every command's `request_id`, so no repeat is recognised by it."""

    def handle(self, request: Any) -> dict[str, Any]:
        command = request.get("command") if isinstance(request, dict) else None
        if isinstance(command, dict) and "request_id" in command:
            request = {**request, "command": {**command, "request_id": None}}
        return super().handle(request)


class LateUpdates(ReferenceImplementation):
    """Reads back every RUNNING workload with `updated_at` 1 ms later than stored."""

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if isinstance(request, dict) and request.get("type") == "store" and "ok" in response:
            for entry in response["ok"]:
                if entry["document"].get("state") == "RUNNING":
                    entry["document"]["updated_at"] += 1
        return response


class NoInputHash(ReferenceImplementation):
    """Reads back every document without its `input_hash`."""

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if isinstance(request, dict) and request.get("type") == "store" and "ok" in response:
            for entry in response["ok"]:
                entry["document"].pop("input_hash", None)
        return response


class VersionZero(ReferenceImplementation):
    """Reads back every document at version 0."""

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if isinstance(request, dict) and request.get("type") == "store" and "ok" in response:
            for entry in response["ok"]:
                entry["version"] = 0
        return response


class ListsTwice(ReferenceImplementation):
    """Reads back every document twice."""

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if isinstance(request, dict) and request.get("type") == "store" and "ok" in response:
            response["ok"] = response["ok"] + response["ok"]
        return response


class StoreObject(ReferenceImplementation):
    """Reads the store back as an object of documents by key, not a list."""

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if isinstance(request, dict) and request.get("type") == "store" and "ok" in response:
            return {"ok": {entry["key"]: entry for entry in response["ok"]}}
        return response


class RefusesAll(ReferenceImplementation):
    """Refuses every request, as an adapter whose backend cannot be reached does."""

    def handle(self, request: Any) -> dict[str, Any]:
        return {"error": {"code": "WORKLOAD_STORAGE_FAILURE", "message": "nothing listens"}}


class CodelessRefusals(ReferenceImplementation):
    """Answers `error` (an object without a code, or `null`) where the reply is `null`."""

    def __init__(self, error: Any) -> None:
        super().__init__()
        self.error = error

    def handle(self, request: Any) -> dict[str, Any]:
        response = super().handle(request)
        if (
            isinstance(request, dict)
            and request.get("type") == "command"
            and response == {"ok": None}
        ):
            return {"error": self.error}
        return response


class Twice:
    """A text stream that writes every line it is given twice, in one write."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        self.stream.write(text + text)

    def flush(self) -> None:
        self.stream.flush()


class _Larger(str):
    """A workload id that sorts in reverse."""

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)

    def __gt__(self, other: str) -> bool:
        return str.__lt__(self, other)


def lingers() -> int:
    """Answer each request 1.5 s late; at the end of input leave a child on stdout for 1 s."""
    for line in sys.stdin:
        if line.strip():
            time.sleep(1.5)
            print('{"ok":null}', flush=True)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    return 0


def not_utf8() -> int:
    """Answer the first request, then every other with bytes that are not UTF-8."""
    for number, line in enumerate(sys.stdin):
        if line.strip():
            sys.stdout.buffer.write(b'{"ok":null}\n' if number == 0 else b"\xff\xfe{}\n")
            sys.stdout.flush()
    return 0


def endless_line() -> int:
    """Answer the first request; to the next, write a line that never ends."""
    for number, _ in enumerate(sys.stdin):
        if number == 0:
            print('{"ok":null}', flush=True)
            continue
        sys.stdout.write('{"ok":"')
        while True:
            sys.stdout.write("x" * (1 << 20))
    return 0


def endless_stderr() -> int:
    """Write 100 MiB on standard error without a line break, then exit."""
    for _ in range(100):
        sys.stderr.write("x" * (1 << 20))
    sys.stderr.flush()
    return 3


def nested_reply(depth: int) -> int:
    """Answer a reset and a store read-back as the reference does, a command with a deep reply."""
    reference = ReferenceImplementation()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("type") == "command":
            print('{"ok":' + "[" * depth + "]" * depth + "}", flush=True)
        else:
            print(json.dumps(reference.handle(request)), flush=True)
    return 0


def long_number() -> int:
    """Answer a reset and a store read-back as the reference does, a command with a long number."""
    reference = ReferenceImplementation()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("type") == "command":
            print('{"ok":' + "9" * 5000 + "}", flush=True)
        else:
            print(json.dumps(reference.handle(request)), flush=True)
    return 0


def lone_surrogate() -> int:
    """Answer a reset and a store read-back as the reference does, a command with `"\\ud800"`."""
    reference = ReferenceImplementation()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("type") == "command":
            print('{"ok":"\\ud800"}', flush=True)
        else:
            print(json.dumps(reference.handle(request)), flush=True)
    return 0


class StderrControls(ReferenceImplementation):
    """Writes control characters on standard error at its first command, and exits."""

    def handle(self, request: Any) -> dict[str, Any]:
        if isinstance(request, dict) and request.get("type") == "command":
            sys.stderr.write("bad\x00byte \x1b[31mred\x1b[0m\x0cend\n")
            sys.stderr.flush()
            raise SystemExit(4)
        return super().handle(request)


def stops_reading() -> int:
    """Answer two requests (a reset, a store read-back), then sleep without reading on."""
    for answer in (b'{"ok":null}\n', b'{"ok":[]}\n'):
        sys.stdin.buffer.readline()
        sys.stdout.buffer.write(answer)
        sys.stdout.flush()
    time.sleep(3600)
    return 0


def main(mistake: str, spec: str | None = None) -> int:
    reference: ReferenceImplementation
    if mistake == "lingers":
        return lingers()
    if mistake == "not-utf8":
        return not_utf8()
    if mistake == "nested-reply":
        return nested_reply(int(spec or 0))
    if mistake == "long-number":
        return long_number()
    if mistake == "lone-surrogate":
        return lone_surrogate()
    if mistake == "stops-reading":
        return stops_reading()
    if mistake == "endless-line":
        return endless_line()
    if mistake == "endless-stderr":
        return endless_stderr()
    if mistake == "budget":
        text = shipped_spec_text()
        assert BUDGET_RULE in text, "the failure policy's budget rule is where this expects it"
        reference = ReferenceImplementation(load_spec_text(text.replace(BUDGET_RULE, "", 1)))
    elif mistake == "stale-fence":
        reference = StaleFencesAccepted()
    elif mistake == "crash":
        reference = Crashes()
    elif mistake == "stderr-controls":
        reference = StderrControls()
    elif mistake == "hang":
        reference = Hangs()
    elif mistake == "closes-stdout":
        reference = ClosesStdout()
    elif mistake.startswith("unfenced-"):
        reference = SkipsAFenceCheck("fence", mistake.removeprefix("unfenced-"))
    elif mistake.startswith("lease-unchecked-"):
        reference = SkipsAFenceCheck("lease", mistake.removeprefix("lease-unchecked-"))
    elif mistake == "ignores-request-ids":
        reference = IgnoresRequestIds()
    elif mistake == "doc-field":
        reference = LateUpdates(load_spec(spec))
    elif mistake == "no-input-hash":
        reference = NoInputHash()
    elif mistake == "version-zero":
        reference = VersionZero()
    elif mistake == "lists-twice":
        reference = ListsTwice()
    elif mistake == "store-object":
        reference = StoreObject()
    elif mistake == "refuses-reset":
        reference = RefusesAll()
    elif mistake == "codeless-refusal":
        reference = CodelessRefusals({"message": "the scheduler is not available"})
    elif mistake == "null-refusal":
        reference = CodelessRefusals(None)
    elif mistake == "tie-largest-id":
        memory._order = lambda doc: (-doc.index.priority, doc.index.created_at, _Larger(doc.key))
        reference = ReferenceImplementation()
    elif mistake == "answers-twice":
        serve(ReferenceImplementation(), sys.stdin, Twice(sys.stdout))  # type: ignore[arg-type]
        return 0
    else:
        print(json.dumps({"error": f"unknown mistake {mistake!r}"}), file=sys.stderr)
        return 2
    serve(reference, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
