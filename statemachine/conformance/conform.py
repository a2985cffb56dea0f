"""Holding another implementation to the reference: the vectors, run through a program.

`run_conformance(argv, vectors)` runs the conformance vectors against a
program speaking the conformance protocol (`docs/conformance.md`): one
request a line on its standard input, one response a line on its standard
output. Each scenario is reported passed, or failed with the first step that
differs, expected and actual side by side (`compare_step`). A program that
exits, or does not answer within the timeout, fails the scenario with a
message that says so, and is started afresh for the next one; one that
cannot start or fails its very first request stops the run at once
(`CONFORMANCE_PROGRAM_UNUSABLE`). `junit_xml`
writes the results for CI systems. Recorded histories are checked by
`decisions.check_history`.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import itertools
import json
import queue
import re
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from pydantic import BaseModel, ValidationError

from workwarden.statemachine.conformance.runner import (
    Expectation,
    ReferenceImplementation,
    Snapshot,
    VectorScenario,
    VectorStep,
    document_digest,
    observe,
    snapshot,
)
from workwarden.statemachine.conformance.schemas import REPLY_MODELS
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.models import Event
from workwarden.statemachine.spec import Spec

__all__ = [
    "MAX_RESPONSE_BYTES",
    "PROGRAM_UNUSABLE",
    "ConformanceProgram",
    "ProgramError",
    "ProgramUnusable",
    "ScenarioResult",
    "StepDifference",
    "compare_step",
    "junit_xml",
    "printable",
    "run_conformance",
    "shown_argv",
]


# -- running vectors against a program ----------------------------------------------------


#: The code of a run that stops at once: the program cannot serve a single request.
PROGRAM_UNUSABLE = "CONFORMANCE_PROGRAM_UNUSABLE"

#: The longest response line read, in bytes (the vectors' largest is some kilobytes): a
#: program writing a line that never ends is stopped instead of filling the memory.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class _Overlong(str):
    """What the pump hands over in place of a line longer than `MAX_RESPONSE_BYTES`."""


class ProgramError(Exception):
    """The program under test exited, did not answer in time, or answered outside the protocol."""


class ProgramUnusable(ProgramError):
    """The program cannot be started, or failed the first request it was ever sent."""


class ConformanceProgram:
    """A program speaking the conformance protocol, one JSON line each way.

    Each response must come within `timeout` seconds; the first after the
    program starts, within `startup` seconds (if longer).
    """

    def __init__(self, argv: Sequence[str], timeout: float, startup: float = 30.0) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self.startup = startup
        self._starting = False
        self._process: subprocess.Popen[str] | None = None
        # The pump hands over the lines of each read of the program's output together, so
        # a line written with its answer is seen before the next request is sent.
        self._lines: queue.Queue[list[str] | None] = queue.Queue()
        self._pending: deque[str] = deque()
        self._stderr: deque[str] = deque(maxlen=20)
        # Requests are written by a thread of their own (`_feed`), so a program that stops
        # reading its input blocks that thread, never the run.
        self._writes: queue.Queue[str | None] = queue.Queue()
        self._unread = threading.Event()  # set when a request could not be written
        #: How many valid responses the program has given, over all its starts.
        self.answered = 0

    def _start(self) -> subprocess.Popen[str]:
        try:
            process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                bufsize=1,
            )
        except OSError as exc:
            raise ProgramUnusable(
                f"cannot start {shlex.join(shown_argv(self.argv))}: {exc.strerror or exc}"
            ) from None
        # Each start has its own queue and stderr tail, handed to its own threads: a
        # program that exited may hold its stdout open a while longer (a child it left
        # behind), and its end marker must never reach the program started after it.
        self._lines = queue.Queue()
        self._pending = deque()
        self._stderr = deque(maxlen=20)
        self._writes = queue.Queue()
        self._unread = threading.Event()
        threading.Thread(target=self._pump, args=(process, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(process, self._stderr), daemon=True).start()
        threading.Thread(
            target=self._feed,
            args=(process, self._writes, self._unread),
            name="conformance-feed",
            daemon=True,
        ).start()
        self._process = process
        self._starting = True
        return process

    @staticmethod
    def _feed(
        process: subprocess.Popen[str], writes: queue.Queue[str | None], unread: threading.Event
    ) -> None:
        """Write each request handed over on the program's input; at None, close the input.

        A program that stops reading blocks this thread alone: the response's timeout
        stops the program, and the write then fails. A write that fails sets `unread`.
        """
        assert process.stdin is not None
        try:
            while (line := writes.get()) is not None:
                process.stdin.write(line)
                process.stdin.flush()
            process.stdin.close()
        except (OSError, ValueError):
            unread.set()

    @staticmethod
    def _pump(process: subprocess.Popen[str], lines: queue.Queue[list[str] | None]) -> None:
        """Hand over the program's output a read at a time: the whole lines each read ends."""
        assert isinstance(process.stdout, io.TextIOWrapper)
        output = process.stdout.buffer  # read as bytes: whatever is there, up to 64 KiB
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial: list[str] = []
        size = 0  # of the line being read so far, in bytes
        with contextlib.suppress(OSError, ValueError):
            while chunk := output.read1(65536):
                text = decoder.decode(chunk)
                if "\n" not in text:
                    partial.append(text)
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        lines.put([_Overlong()])
                        return
                    continue
                first, *rest = text.split("\n")
                if size + len(first.encode()) > MAX_RESPONSE_BYTES:
                    lines.put([_Overlong()])
                    return
                whole = ["".join(partial) + first, *rest[:-1]]
                partial = [rest[-1]]
                size = len(rest[-1].encode())
                lines.put([line + "\n" for line in whole])
        rest_of_output = "".join(partial) + decoder.decode(b"", final=True)
        if rest_of_output:
            lines.put([rest_of_output])
        lines.put(None)

    @staticmethod
    def _drain(process: subprocess.Popen[str], tail: deque[str]) -> None:
        """Keep the last lines of standard error, each cut to its last 1000 characters.

        Read a chunk at a time, so a line that never breaks is never held whole.
        """
        assert isinstance(process.stderr, io.TextIOWrapper)
        stream = process.stderr.buffer  # read as bytes: whatever is there, up to 8 KiB
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial = ""
        with contextlib.suppress(OSError, ValueError):
            while chunk := stream.read1(8192):
                *whole, partial = (partial + decoder.decode(chunk)).split("\n")
                tail.extend(line[-1000:] for line in whole)
                partial = partial[-1000:]
        if partial:
            tail.append(partial)

    def _stderr_tail(self) -> str:
        time.sleep(0.05)  # let the last lines of a dying program arrive
        tail = "\n".join(self._stderr)
        return f"; its last words on stderr:\n{tail}" if tail else ""

    def unasked(self) -> str | None:
        """A line the program wrote that no request asked for (read so far), or None."""
        if not self._pending:
            try:
                batch = self._lines.get_nowait()
            except queue.Empty:
                return None
            if batch is None:
                self._lines.put(None)  # its end of output, left for the next read to report
                return None
            self._pending.extend(batch)
        return self._pending.popleft()

    def _next_line(self, timeout: float) -> str | None:
        """The next line of output (`queue.Empty` after `timeout` s), or None at its end."""
        if not self._pending:
            batch = self._lines.get(timeout=timeout)
            if batch is None:
                return None
            self._pending.extend(batch)
        return self._pending.popleft()

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and return its response (a JSON object with `ok` or `error`).

        A line waiting unread before the request is sent was written unasked (a
        response written twice, a log line after an answer): it is reported, not taken
        for the answer to this request.
        """
        process = self._process if self._process is not None else self._start()
        assert process.stdin is not None
        extra = self.unasked()
        if extra is not None:
            raise ProgramError(f"the program wrote a line no request asked for: {extra[:200]!r}")
        # Written by `_feed`: the timeout bounds the write and the answer together.
        self._writes.put(json.dumps(message, sort_keys=True) + "\n")
        # The first response may also wait for the program to start up.
        limit = max(self.timeout, self.startup) if self._starting else self.timeout
        self._starting = False
        try:
            line = self._next_line(limit)
        except queue.Empty:
            self.close(kill=True)
            raise ProgramError(
                f"no response within {limit:g} s to a {message.get('type')} request; "
                "the program was stopped"
            ) from None
        if isinstance(line, _Overlong):
            self.close(kill=True)
            raise ProgramError(
                f"the response is longer than {MAX_RESPONSE_BYTES} bytes without a line break;"
                " the program was stopped"
            )
        if line is None:
            try:
                status = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                # It closed its standard output but lives on: stop it, and say so.
                self.close(kill=True)
                raise ProgramError(
                    f"the program closed its standard output instead of answering a "
                    f"{message.get('type')} request, and did not exit within 5 s; "
                    "the program was stopped" + self._stderr_tail()
                ) from None
            self._process = None
            self._writes.put(None)  # `_feed` ends
            how = "before reading" if self._unread.is_set() else "instead of answering"
            raise ProgramError(
                f"the program exited (status {status}) {how} a "
                f"{message.get('type')} request" + self._stderr_tail()
            )
        try:
            response = json.loads(line)
        except json.JSONDecodeError:
            raise ProgramError(f"the response is not one line of JSON: {line[:200]!r}") from None
        except RecursionError:
            raise ProgramError(
                f"the response is JSON nested too deeply to read: {line[:200]!r}"
            ) from None
        except ValueError:
            # JSON, but an integer of more digits than Python reads (4300).
            raise ProgramError(
                f"the response holds a number too long to read: {line[:200]!r}"
            ) from None
        if (
            not isinstance(response, dict)
            or len(response) != 1
            or not ("ok" in response or "error" in response)
        ):
            raise ProgramError(
                f'a response must be {{"ok": ...}} or {{"error": {{...}}}}, not {line[:200]!r}'
            )
        error = response.get("error")
        if "error" in response and (
            not isinstance(error, dict) or not isinstance(error.get("code"), str)
        ):
            # A refusal is told apart by its code alone: one without a code would compare
            # equal to a `null` reply.
            raise ProgramError(
                "an error must be an object with a string code (from the catalogue), not "
                f"{line[:200]!r}"
            )
        self.answered += 1
        return response

    def close(self, *, kill: bool = False) -> None:
        """Stop the program (if it runs): end its input and wait, or `kill` it at once."""
        process, self._process = self._process, None
        if process is None:
            return
        # Its input is closed by `_feed` once the requests before are written (closed here,
        # it would wait on a write the program may never read), and `_feed` then ends.
        self._writes.put(None)
        if kill:
            process.kill()
            process.wait()
            return
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class StepDifference:
    """The first thing a step got wrong: what (`aspect`), expected and actual, and detail lines."""

    step: int
    steps: int
    command: dict[str, Any]
    now: int
    aspect: str
    expected: Any
    actual: Any
    details: tuple[str, ...] = ()

    def render(self) -> list[str]:
        """The difference as report lines."""
        op = self.command.get("op", "?")
        lines = [
            f"step {self.step} of {self.steps}: {op} at now={self.now}",
            f"  command   {_compact(self.command, 400)}",
            f"  differs in {self.aspect}",
            f"  expected  {_compact(self.expected, 400)}",
            f"  actual    {_compact(self.actual, 400)}",
        ]
        lines += [f"  {line}" for line in self.details]
        return lines


@dataclass
class ScenarioResult:
    """One scenario's outcome: passed, its first difference, or what went wrong with the program."""

    name: str
    passed: bool
    difference: StepDifference | None = None
    error: str | None = None
    seconds: float = 0.0

    def render(self) -> list[str]:
        """The result as report lines, each printable (see `printable`)."""
        if self.passed:
            return [f"PASS {printable(self.name)}"]
        lines = [f"FAIL {self.name}"]
        if self.difference is not None:
            lines += [f"  {line}" for line in self.difference.render()]
        if self.error is not None:
            # Split at line feeds alone: another line break (a form feed) is shown escaped.
            lines += [f"  {line}" for line in self.error.split("\n")]
        return [printable(line) for line in lines]


#: What `printable` escapes: control characters but the tab, line and paragraph separators,
#: lone surrogates (a `\ud800` escape in a response) and the two noncharacters XML refuses.
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def printable(text: str) -> str:
    """`text` as one line that a terminal, UTF-8 and XML 1.0 all take: each character of
    `_UNPRINTABLE` written as its escape (`\\x1b`, `\\ud800`).

    What a program under test writes (on stderr, in a reply) is shown, never obeyed by the
    terminal, and never makes the report unwritable or the JUnit file malformed.
    """
    return _UNPRINTABLE.sub(lambda found: repr(found.group())[1:-1], text)


def _compact(value: Any, limit: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _paths(expected: Any, actual: Any, path: str = "$") -> Iterator[tuple[str, Any, Any]]:
    """The paths at which two JSON values differ, with the two values there."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            where = f"{path}.{key}"
            if key not in actual:
                yield where, expected[key], "(absent)"
            elif key not in expected:
                yield where, "(absent)", actual[key]
            else:
                yield from _paths(expected[key], actual[key], where)
    elif isinstance(expected, list) and isinstance(actual, list):
        for index in range(max(len(expected), len(actual))):
            where = f"{path}[{index}]"
            if index >= len(actual):
                yield where, expected[index], "(absent)"
            elif index >= len(expected):
                yield where, "(absent)", actual[index]
            else:
                yield from _paths(expected[index], actual[index], where)
    elif expected != actual or type(expected) is not type(actual):
        yield path, expected, actual


def _side_by_side(expected: Any, actual: Any, limit: int = 8) -> tuple[str, ...]:
    rows = list(itertools.islice(_paths(expected, actual), limit + 1))
    if not rows:
        return ()
    width = min(max(len(path) for path, _, _ in rows[:limit]), 60)
    lines = [f"{'path':<{width}}  expected  |  actual"]
    for path, want, got in rows[:limit]:
        lines.append(f"{path:<{width}}  {_compact(want, 60)}  |  {_compact(got, 60)}")
    if len(rows) > limit:
        lines.append("... and more")
    return tuple(lines)


def _normal_reply(op: Any, reply: Any) -> Any:
    model: type[BaseModel] | None = REPLY_MODELS.get(op) if isinstance(op, str) else None
    if model is None or reply is None:
        return reply
    try:
        return model.model_validate(reply).model_dump(mode="json", by_alias=True)
    except ValidationError:
        return reply


def _normal_events(events: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, items in events.items():
        try:
            out[key] = [
                Event.model_validate(e).model_dump(mode="json", by_alias=True) for e in items
            ]
        except ValidationError:
            out[key] = items
    return out


def compare_step(
    index: int,
    steps: int,
    expected: VectorStep,
    actual: Expectation,
    reference_documents: Snapshot | None = None,
    actual_documents: Snapshot | None = None,
) -> StepDifference | None:
    """The first way `actual` differs from what `expected` says, or None.

    Compared in order: the response (an error by its code, a reply whole),
    the events appended, the state of the command's workload, then the
    store's documents by version and digest (shown field by field when the
    reference's documents at this step are given).
    """
    want, got = expected.expect, actual

    def differ(aspect: str, a: Any, b: Any, details: tuple[str, ...] = ()) -> StepDifference:
        return StepDifference(index, steps, expected.command, expected.now, aspect, a, b, details)

    op = expected.command.get("op")
    want_error = want.response.get("error")
    got_error = got.response.get("error")
    if ("error" in want.response) != ("error" in got.response):
        return differ("response", want.response, got.response)
    if isinstance(want_error, Mapping) or isinstance(got_error, Mapping):
        want_code = want_error.get("code") if isinstance(want_error, Mapping) else None
        got_code = got_error.get("code") if isinstance(got_error, Mapping) else None
        if want_code != got_code:
            return differ("response", want.response, got.response)
    else:
        a = _normal_reply(op, want.response.get("ok"))
        b = _normal_reply(op, got.response.get("ok"))
        if a != b:
            return differ("reply", a, b, _side_by_side(a, b))
    a_events, b_events = _normal_events(want.events), _normal_events(got.events)
    if a_events != b_events:
        return differ("events appended", a_events, b_events, _side_by_side(a_events, b_events))
    if want.state != got.state:
        return differ("state", want.state, got.state)
    a_store = {k: v.model_dump() for k, v in want.store.items()}
    b_store = {k: v.model_dump() for k, v in got.store.items()}
    if a_store != b_store:
        details = _side_by_side(a_store, b_store)
        if reference_documents is not None and actual_documents is not None:
            for key in sorted(set(a_store) & set(b_store)):
                if a_store[key] != b_store[key] and key in reference_documents:
                    mine = reference_documents[key]
                    if (
                        document_digest(mine[1]) == a_store[key]["digest"]
                        and key in actual_documents
                    ):
                        details += (f"document {key}:",)
                        details += _side_by_side(mine[1], actual_documents[key][1])
                    break
        return differ("store (version and digest by key)", a_store, b_store, details)
    return None


def _reference_documents(spec: Spec | None, vector: VectorScenario) -> Iterator[Snapshot]:
    """The reference's store after each step of `vector`, for field-by-field differences."""
    reference = ReferenceImplementation(spec)
    reference.handle(
        {
            "type": "reset",
            "store": [e.model_dump(mode="json") for e in vector.store],
            "grant_keys": vector.grant_keys,
        }
    )
    for step in vector.steps:
        reference.handle({"type": "command", "command": step.command, "now": step.now})
        yield snapshot(reference.handle({"type": "store"})["ok"])


def _actual_snapshot(response: Mapping[str, Any]) -> Snapshot:
    entries = response.get("ok")
    if "error" in response:
        raise ProgramError(f"the store read-back was refused: {_compact(response, 300)}")
    if not isinstance(entries, list):
        raise ProgramError(
            f"the store read-back is not a list of entries: {_compact(response, 300)}"
        )
    try:
        return snapshot(entries)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProgramError(f"the store read-back does not hold workload documents: {exc}") from None


def _run_one(
    program: ConformanceProgram, vector: VectorScenario, spec: Spec | None
) -> ScenarioResult:
    started = time.perf_counter()
    result = ScenarioResult(name=vector.name, passed=False)
    step_number = 0
    try:
        reset = program.request(
            {
                "type": "reset",
                "store": [e.model_dump(mode="json") for e in vector.store],
                "grant_keys": vector.grant_keys,
            }
        )
        if "ok" not in reset:
            if program.answered == 1:
                # The very first request of the run was refused (a service it cannot reach,
                # a token it is refused): every scenario would be refused the same way.
                program.close(kill=True)
                raise ProgramUnusable(
                    f"{shlex.join(shown_argv(program.argv))} refused its first request (reset): "
                    f"{_compact(reset, 300)}"
                )
            raise ProgramError(f"reset was refused: {_compact(reset, 300)}")
        before = _actual_snapshot(program.request({"type": "store"}))
        references: Iterator[Snapshot] | None = None
        for step_number, step in enumerate(vector.steps, start=1):
            response = program.request(
                {"type": "command", "command": step.command, "now": step.now}
            )
            after = _actual_snapshot(program.request({"type": "store"}))
            try:
                actual = observe(step.command, response, before, after)
            except ValidationError:
                # A reply deeper than a JSON value is held (the reference's never are).
                raise ProgramError("the response is JSON nested too deeply to compare") from None
            if references is None:
                references = _reference_documents(spec, vector)
            mine = next(references, None)
            difference = compare_step(step_number, len(vector.steps), step, actual, mine, after)
            if difference is not None:
                result.difference = difference
                break
            before = after
        else:
            extra = program.unasked()
            if extra is not None:
                raise ProgramError(
                    f"the program wrote a line no request asked for: {extra[:200]!r}"
                )
            result.passed = True
    except ProgramUnusable:
        raise
    except ProgramError as exc:
        if program.answered == 0:
            # Not one request was ever answered: every scenario would fail the same way.
            program.close(kill=True)
            raise ProgramUnusable(
                f"{shlex.join(shown_argv(program.argv))} failed its first request: {exc}"
            ) from None
        where = f"at step {step_number} of {len(vector.steps)}" if step_number else "at reset"
        result.error = f"{where}: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def run_conformance(
    argv: Sequence[str],
    vectors: Sequence[VectorScenario],
    *,
    timeout: float = 10.0,
    spec: Spec | None = None,
    progress: Callable[[ScenarioResult], None] | None = None,
) -> list[ScenarioResult]:
    """Run every vector against the program `argv`; one result per scenario, in order.

    `timeout` bounds each response, in seconds (the first after the program
    starts may take 30 s, for start-up). `spec` is the spec the vectors
    were generated from (the shipped one by default); it is used only to show
    a differing document field by field.

    A program that cannot be started, or that fails the first request it is
    ever sent (exits, does not answer, answers outside the protocol, refuses
    it with an error), would fail every scenario the same way: the run stops at once with
    `WorkloadError` `CONFORMANCE_PROGRAM_UNUSABLE`, saying what happened.
    """
    program = ConformanceProgram(argv, timeout)
    results: list[ScenarioResult] = []
    try:
        for vector in vectors:
            try:
                result = _run_one(program, vector, spec)
            except ProgramUnusable as exc:
                raise WorkloadError(
                    PROGRAM_UNUSABLE,
                    f"{exc}; no scenario can run, so none was",
                    {"program": shown_argv(argv), "scenarios_run": len(results)},
                ) from None
            if result.error is not None:
                program.close()
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        program.close()
    return results


#: Options whose value is a secret: never printed back.
_SECRET_OPTIONS = ("--token", "--password", "--secret", "--api-key")
_SECRET_PATTERN = re.compile(r"^wwt1\.|://[^/@\s]*:[^/@\s]*@")


def shown_argv(argv: Sequence[str]) -> list[str]:
    """`argv` as it may be printed: the value of a secret option, a token or a URL's
    password replaced by `<redacted>` (a report lands in CI logs)."""
    shown: list[str] = []
    for index, arg in enumerate(argv):
        previous = argv[index - 1] if index else ""
        name, equals, _ = arg.partition("=")
        if previous in _SECRET_OPTIONS or _SECRET_PATTERN.search(arg):
            shown.append("<redacted>")
        elif equals and name in _SECRET_OPTIONS:
            shown.append(f"{name}=<redacted>")
        else:
            shown.append(arg)
    return shown


def junit_xml(results: Sequence[ScenarioResult], suite: str = "workwarden conformance") -> str:
    """The results as JUnit XML (one test case per scenario, its group as the class name)."""
    failures = sum(1 for r in results if not r.passed and r.error is None)
    errors_ = sum(1 for r in results if r.error is not None)
    root = ElementTree.Element("testsuites")
    node = ElementTree.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(failures),
        errors=str(errors_),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    for result in results:
        group, _, name = printable(result.name).rpartition("/")
        case = ElementTree.SubElement(
            node,
            "testcase",
            classname=f"conformance.{group}" if group else "conformance",
            name=name,
            time=f"{result.seconds:.3f}",
        )
        body = "\n".join(result.render()[1:])
        if result.error is not None:
            message = printable(result.error.split("\n")[0])
            ElementTree.SubElement(case, "error", message=message).text = body
        elif not result.passed and result.difference is not None:
            message = f"step {result.difference.step}: {result.difference.aspect} differs"
            ElementTree.SubElement(case, "failure", message=message).text = body
    ElementTree.indent(root)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        + ElementTree.tostring(root, encoding="unicode")
        + "\n"
    )
