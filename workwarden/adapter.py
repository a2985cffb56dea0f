"""`python -m workwarden.adapter`: the reference implementation behind the conformance protocol.

Reads one JSON request a line on standard input (`reset`, `command`,
`store`; see `docs/conformance.md`) and writes one JSON response a line on
standard output, flushed after each, until its input ends (a line that is
not JSON, nested too deeply or holding a number too long to read, is answered
`WORKLOAD_INVALID`). Behind it is an `Authority` over a `MemoryStore`, under
the shipped spec or `--spec FILE`.
This is the program `workwarden conform` holds other implementations' adapters
beside: it passes every vector, because the vectors were generated with it.
A spec it cannot load is one coded line on standard error (`WORKLOAD_SPEC_INVALID:
...`) and exit status 1, before any request is read.

    workwarden conform --cmd 'python -m workwarden.adapter'
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from workwarden.statemachine.conformance.runner import ReferenceImplementation
from workwarden.statemachine.errors import WorkloadError
from workwarden.statemachine.spec import load_spec

__all__ = ["main", "serve"]


def serve(reference: ReferenceImplementation, requests: TextIO, responses: TextIO) -> None:
    """Answer every request line of `requests` on `responses`, one line each."""
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            response = {"error": {"code": "WORKLOAD_INVALID", "message": f"not JSON: {exc}"}}
        except RecursionError:
            response = {
                "error": {"code": "WORKLOAD_INVALID", "message": "JSON nested too deeply to read"}
            }
        except ValueError:
            # Python reads no integer of more than 4300 digits (`sys.get_int_max_str_digits`).
            response = {
                "error": {"code": "WORKLOAD_INVALID", "message": "a number too long to read"}
            }
        else:
            response = reference.handle(request)
        responses.write(json.dumps(response, sort_keys=True, separators=(",", ":")) + "\n")
        responses.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the protocol on standard input and output; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m workwarden.adapter",
        description="The reference implementation, speaking the conformance protocol.",
    )
    parser.add_argument("--spec", metavar="FILE", help="a spec file (the shipped spec by default)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except WorkloadError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        return 1
    serve(ReferenceImplementation(spec), sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
