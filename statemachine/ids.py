"""The ids the core derives, never generates: the same inputs give the same id, everywhere.

An implementation in another language reproduces each byte for byte:
`docs/design.md` ("Ids and hashes") gives every recipe with a worked example.
"""

from __future__ import annotations

import hashlib

__all__ = ["attempt_id_for", "checkpoint_id_for", "claim_id_for", "lease_id_for"]


def claim_id_for(workload_id: str, token: int, worker_id: str) -> str:
    """The claim id of `worker_id`'s claim of a workload under fencing token `token`.

    As the seed derives it: the first 20 hex digits of the SHA-256 of
    `workload_id:token:worker_id` in UTF-8. Unambiguous: a workload id has no
    colon and a token is digits, so all after the second colon is the worker.
    """
    seed = f"{workload_id}:{token}:{worker_id}".encode()
    return "claim_" + hashlib.sha256(seed).hexdigest()[:20]


def lease_id_for(token: int) -> str:
    """The lease id of the claim under fencing token `token`."""
    return f"lease_{token}"


def attempt_id_for(workload_id: str, attempt: int) -> str:
    """The id of a workload's `attempt`-th attempt (counting from 1)."""
    return f"attempt_{workload_id}_{attempt}"


def checkpoint_id_for(workload_id: str, sequence: int) -> str:
    """The id of a workload's `sequence`-th checkpoint (counting from 1)."""
    return f"checkpoint_{workload_id}_{sequence}"
