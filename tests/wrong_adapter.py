"""A deliberately wrong implementation behind the conformance protocol, for `workwarden conform`.

`python tests/wrong_adapter.py MISTAKE` serves the protocol like
`python -m workwarden.adapter`, except for one mistake:

- `budget`: its failure policy has no attempt-budget rule, so a failure is
  retried past the budget;
- `stale-fence`: it ignores stale fences, deciding every fenced call as if
  the current claim's holder had made it;
- `crash`: it exits at its fourth command;
- `hang`: it never answers a `fail` command.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from workwarden.adapter import serve
from workwarden.statemachine.conformance.vectors import ReferenceImplementation
from workwarden.statemachine.models import Workload
from workwarden.statemachine.spec import load_spec_text, shipped_spec_text

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


def main(mistake: str) -> int:
    reference: ReferenceImplementation
    if mistake == "budget":
        text = shipped_spec_text()
        assert BUDGET_RULE in text, "the failure policy's budget rule is where this expects it"
        reference = ReferenceImplementation(load_spec_text(text.replace(BUDGET_RULE, "", 1)))
    elif mistake == "stale-fence":
        reference = StaleFencesAccepted()
    elif mistake == "crash":
        reference = Crashes()
    elif mistake == "hang":
        reference = Hangs()
    else:
        print(json.dumps({"error": f"unknown mistake {mistake!r}"}), file=sys.stderr)
        return 2
    serve(reference, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
