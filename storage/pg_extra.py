"""What the PostgreSQL store's modules raise when the `postgres` extra is missing.

psycopg and psycopg-pool are the `postgres` extra (`pip install
'workwarden[postgres]'`): a SQLite-only install does without them. Every
module of the PostgreSQL store (`postgres`, `pg_schema`, `pg_connections`,
`pg_offers`) imports them guarded and raises `extra_missing(exc)` in place of
the `ImportError`: a `WorkloadError` with the code `WORKLOAD_EXTRA_MISSING`
whose message is the command that installs the extra. This module imports
neither, so it can say so.
"""

from __future__ import annotations

from workwarden.statemachine.errors import EXTRA_MISSING, WorkloadError

__all__ = ["extra_missing"]


def extra_missing(exc: ImportError) -> WorkloadError:
    """The error to raise in place of `exc`, the failed import of psycopg or psycopg-pool."""
    return WorkloadError(
        EXTRA_MISSING,
        f"the PostgreSQL store needs psycopg and psycopg-pool ({exc.name} is not installed): "
        "pip install 'workwarden[postgres]'",
        {"extra": "postgres", "missing": exc.name},
    )
