"""The stateful suite's retention: an operator purges finished work, between every other call.

`RetentionRules` purges (`Authority.purge`) with a small retention age, so
work the run finished a moment ago is old enough, or as a dry run; which
workloads it deletes is predicted from the committed snapshot (terminal, not
in a `[retention] keep` state, unchanged for at least the age) and held to
the report. A purged workload is gone from the shadow model too, its scope
and result id free; `AdmissionRules.admit_again` then admits its request
afresh, and the shadow model predicts the new document at the version after
the purge's tombstone. The rule runs only with the shadow model on: without
it, the calls other rules make on a purged workload (answered
`WORKLOAD_NOT_FOUND`) cannot be told from wrong answers.

Two checks hold after every step:

- `a_purged_workload_never_reappears_and_no_version_is_reused`: a purged
  key is absent until its scope admits it again, and then it is a new
  workload (created at or after the purge) at a version above the purge's
  tombstone; the text committed at its last version before the purge is
  never replaced;
- `kept_states_are_never_purged`: every purge's audit record deleted a
  document in a state `[retention] keep` does not name (dead letters stay).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from workwarden.statemachine.authority import Authority
from workwarden.statemachine.models import Workload
from workwarden.statemachine.properties.audit_log import PURGE_OPERATION
from workwarden.statemachine.retention import PurgeReport
from workwarden.storage.base import Purges
from workwarden.testing.machine import WRITERS, MachineBase

__all__ = ["AGES", "RetentionRules"]

#: The retention ages the suite purges with, in ms (None: the spec's own, which the
#: suite's clock seldom reaches, so such a purge usually finds every workload young).
AGES: tuple[int | None, ...] = (0, 0, 500, 5_000, None)


@dataclass(frozen=True)
class _Purged:
    """What a purge deleted: the version and text it deleted, and when."""

    version: int
    text: str
    at: int


class RetentionRules(MachineBase):
    """An operator's purge of finished work, and the checks on what it leaves."""

    def __init__(self) -> None:
        super().__init__()
        self._purged: dict[str, _Purged] = {}
        self._purges_checked = 0

    def _can_purge(self) -> bool:
        terminal = type(self).spec.terminal_states
        return (
            self.shadow is not None
            and isinstance(self.store, Purges)
            and any(w.state in terminal for _, w in self._parsed.values())
        )

    @precondition(lambda self: self._can_purge())
    @rule(writer=WRITERS, age=st.sampled_from(AGES), dry_run=st.booleans())
    def purge(self, writer: Authority, age: int | None, dry_run: bool) -> None:
        """An operator purges finished work older than `age` (the spec's age when None),
        or reports what it would purge (`dry_run`, which writes nothing). Exactly the
        terminal workloads outside the `[retention] keep` states, unchanged for at least the
        age, are purged; the kept and the young are counted."""
        spec = type(self).spec
        keep = frozenset(spec.data.retention.keep)
        limit = spec.data.retention.after_ms if age is None else age
        documents = {doc.key: doc for doc in self.store.scan()}
        expected = PurgeReport()
        for key in sorted(documents):
            workload = Workload.model_validate_json(documents[key].document)
            if workload.state not in spec.terminal_states:
                continue
            if workload.state in keep:
                expected.kept += 1
            elif self.now - workload.updated_at < limit:
                expected.young += 1
            else:
                expected.purged.append(key)
        before = self._snapshot()
        reply, error = self._call(
            "purge",
            f"purge older than {limit} ms{' (dry run)' if dry_run else ''} (operator)",
            lambda: writer.purge(self.now, older_than_ms=age, actor="operator-1", dry_run=dry_run),
            None,
            frozenset(),
        )
        if error is not None:
            return
        assert isinstance(reply, PurgeReport)
        note(f"    purged {reply.purged}, kept {reply.kept}, young {reply.young}")
        self._expect(
            reply == expected,
            f"the purge reported {reply}, the committed snapshot says {expected}",
            "kept_states_are_never_purged",
        )
        if dry_run:
            self._expect(self._snapshot() == before, "a dry run wrote", "refusals_change_nothing")
            return
        for key in reply.purged:
            doc = documents[key]
            self._purged[key] = _Purged(doc.version, doc.document, self.now)
            if self.shadow is not None:
                self.shadow.purge(key)
            self._parsed.pop(key, None)
            self._index.pop(key, None)

    @invariant()
    def a_purged_workload_never_reappears_and_no_version_is_reused(self) -> None:
        """A purged key is absent, or admitted again as new above its tombstone's version.

        Not by when it was created: an admission decided before the purge (held
        while it ran) commits after it as a new document, with the instant it
        was decided at.
        """
        if not self._purged:
            return
        present = {doc.key: doc for doc in self.store.scan()}
        for key, gone in sorted(self._purged.items()):
            if self.store.versions.get((key, gone.version)) != gone.text:
                self._fail(
                    "a_purged_workload_never_reappears_and_no_version_is_reused",
                    f"{key} v{gone.version}, purged at {gone.at}, was written again",
                )
            doc = present.get(key)
            if doc is None:
                continue
            if doc.version <= gone.version + 1:
                self._fail(
                    "a_purged_workload_never_reappears_and_no_version_is_reused",
                    f"{key}, purged at v{gone.version} (tombstone v{gone.version + 1}) at "
                    f"{gone.at}, is back at v{doc.version}",
                )

    @invariant()
    def kept_states_are_never_purged(self) -> None:
        """Every purge deleted a document in a state the `[retention] keep` list leaves out."""
        spec = type(self).spec
        keep = frozenset(spec.data.retention.keep)
        audit = self.store.audit_log()
        for record in audit[self._purges_checked :]:
            if record.operation != PURGE_OPERATION:
                continue
            text = self.store.versions.get((record.key, record.version - 1))
            if text is None:
                self._fail(
                    "kept_states_are_never_purged",
                    f"{record.key} was purged at v{record.version} with no v{record.version - 1}",
                )
                continue
            state = Workload.model_validate_json(text).state
            if state in keep or state not in spec.terminal_states:
                self._fail(
                    "kept_states_are_never_purged",
                    f"{record.key} was purged in {state}",
                )
        self._purges_checked = len(audit)
