"""The fence carried downstream: a resource that refuses writes from a superseded claim.

The authority refuses a stale fence on its own calls, but a worker frozen past
its lease can still write to a database or call a service after another worker
has taken the work over. A fence only protects what checks it. This module is
that check for the places a handler writes to:

- `guard(conn, fence, workload_id)` inside the caller's own transaction on a
  SQLite (`sqlite3.Connection`) or PostgreSQL (`psycopg.Connection`) database:
  it records the highest fencing token seen per workload (and resource key) in
  the table `workwarden_fences`, made on first use, and refuses a lower token,
  or the same token from another claim, with `WORKLOAD_STALE_FENCE`. The record
  and the caller's write commit together or not at all.
- The `Workwarden-Fence` HTTP header (`format_fence_header`,
  `parse_fence_header`) and `FenceChecker` for the receiving side, which applies
  the same rule over a `FenceRecord`: `MemoryFenceRecord` (one process, thread
  safe) or `SqlFenceRecord` (the guard above, in the receiver's transaction).

`docs/fence.md` says what this guarantees and what it does not.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, TypeVar

from pydantic import ValidationError

from workwarden.statemachine import errors
from workwarden.statemachine.ids import claim_id_for
from workwarden.statemachine.inputs import as_name, invalid_from_validation
from workwarden.statemachine.models import Fence

try:
    import psycopg
    from psycopg.rows import tuple_row
except ImportError:  # pragma: no cover - depends on the environment
    # psycopg is the `postgres` extra: a SQLite-only install guards SQLite alone.
    _HAS_PSYCOPG = False
else:
    _HAS_PSYCOPG = True

__all__ = [
    "FENCE_HEADER",
    "FENCE_TABLE",
    "FenceChecker",
    "FenceRecord",
    "FencedCall",
    "MemoryFenceRecord",
    "SqlFenceRecord",
    "ensure_fence_table",
    "forget",
    "format_fence_header",
    "guard",
    "parse_fence_header",
]

FENCE_TABLE = "workwarden_fences"
"""The table `guard` keeps the highest token seen in, one row per workload and resource."""

FENCE_HEADER = "Workwarden-Fence"
"""The HTTP header a fenced call carries: `workload;claim;worker;token`, ids percent-encoded."""

# The whole workload, when the caller names no resource: a resource key is a
# name (at least one character), so the empty text is never one.
_WHOLE_WORKLOAD = ""

# PostgreSQL: the transaction-scoped advisory lock two first uses take, so
# that only one of them creates the table ("workward" in ASCII).
_CREATE_LOCK = 0x776F726B77617264

_MAX_HEADER_CHARS = 8192
_ENCODED_ID = re.compile(r"(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})+")
_TOKEN = re.compile(r"[1-9][0-9]{0,15}")

_SQLITE_TABLE = f"""CREATE TABLE IF NOT EXISTS {FENCE_TABLE} (
    workload_id TEXT NOT NULL,
    resource TEXT NOT NULL,
    token INTEGER NOT NULL,
    claim_id TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    PRIMARY KEY (workload_id, resource)
)"""

_POSTGRES_TABLE = _SQLITE_TABLE.replace("token INTEGER", "token BIGINT")

# One statement decides and records: the row moves forward to a higher token,
# or stays for the same claim's token; otherwise nothing changes and no row is
# returned. On PostgreSQL the conflicting row is locked while this runs, so a
# concurrent transaction waits and then decides on what this one committed.
_ADVANCE = f"""INSERT INTO {FENCE_TABLE} AS seen (workload_id, resource, token, claim_id, worker_id)
VALUES ({{p}}, {{p}}, {{p}}, {{p}}, {{p}})
ON CONFLICT (workload_id, resource) DO UPDATE
SET token = excluded.token, claim_id = excluded.claim_id, worker_id = excluded.worker_id
WHERE excluded.token > seen.token
   OR (excluded.token = seen.token AND excluded.claim_id = seen.claim_id)
RETURNING token"""

_SEEN = f"SELECT token, claim_id FROM {FENCE_TABLE} WHERE workload_id = {{p}} AND resource = {{p}}"

# The columns the guard writes, and what each must hold: a table of the name
# made otherwise (by hand, by another tool) is refused before it is used, since
# one that compares tokens as text ("10" < "9") would let a stale writer in.
_COLUMNS = {
    "workload_id": "text",
    "resource": "text",
    "token": "integers",
    "claim_id": "text",
    "worker_id": "text",
}
_KEY = frozenset({"workload_id", "resource"})

# SQLite: each column's name, its declared type, whether it is NOT NULL, its
# default and its place in the primary key; then each unique index's columns
# (a column of an expression is NULL).
_SQLITE_COLUMNS = 'SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?)'
_SQLITE_UNIQUE = (
    "SELECT il.name, il.partial, ii.name FROM pragma_index_list(?) AS il,"
    ' pragma_index_info(il.name) AS ii WHERE il."unique"'
)

# PostgreSQL: the relation's kind, its columns (name, "integers" / "text" /
# the type it has, whether an insert must give it a value) and its unique
# indexes (usable as the ON CONFLICT arbiter, key column names; an expression
# is NULL); first, whether the name is a relation on the search path at all
# (the rest is NULL when it is, but made after this transaction's snapshot).
_POSTGRES_SHAPE = """SELECT t.oid IS NOT NULL, c.relkind::text,
  (SELECT json_agg(json_build_array(
      a.attname,
      CASE
        WHEN a.atttypid = 'int8'::regtype
          OR (a.atttypid = 'numeric'::regtype AND a.atttypmod = -1) THEN 'integers'
        WHEN a.atttypid = 'text'::regtype
          OR (a.atttypid = 'varchar'::regtype AND (a.atttypmod = -1 OR a.atttypmod >= 260))
          THEN 'text'
        ELSE format_type(a.atttypid, a.atttypmod)
      END,
      a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
    ) ORDER BY a.attnum)
   FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
  (SELECT json_agg(json_build_array(
      i.indpred IS NULL AND i.indexprs IS NULL,
      (SELECT json_agg(a.attname)
       FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) AS k(attnum)
       LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum)
    ))
   FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique)
FROM (SELECT to_regclass(%s) AS oid) AS t LEFT JOIN pg_class c ON c.oid = t.oid"""


def _invalid(field: str, message: str) -> errors.WorkloadError:
    return errors.WorkloadError(
        errors.INVALID,
        f"{field}: {message}",
        {"field": field, "errors": [{"field": field, "message": message}]},
    )


def _under(prefix: str, exc: errors.WorkloadError) -> errors.WorkloadError:
    """`exc`'s field paths named under the argument `prefix` (`token` as `fence.token`)."""
    problems = [
        {**problem, "field": f"{prefix}.{problem['field']}" if problem["field"] else prefix}
        for problem in (exc.details or {}).get("errors", [])
    ]
    first = problems[0] if problems else {"field": prefix, "message": exc.message}
    return errors.WorkloadError(
        exc.code, f"{first['field']}: {first['message']}", {"errors": problems}
    )


def _checked(fence: Any, workload_id: Any, resource: Any) -> tuple[Fence, str, str]:
    """The fence, workload id and resource key, checked; `WORKLOAD_INVALID` otherwise.

    A fence is bound to its workload: its claim id is derived from the
    workload id, the token and the worker id, so a fence presented with
    another workload's id is refused rather than compared with that
    workload's tokens (which count independently).
    """
    if isinstance(fence, Fence):
        # A Fence is not validated when made with `model_construct` or when a
        # field is assigned afterwards: its fields are checked as a mapping's.
        fence = {name: getattr(fence, name) for name in Fence.model_fields if hasattr(fence, name)}
    if isinstance(fence, Mapping):
        try:
            fence = Fence.model_validate(fence)
        except ValidationError as exc:
            raise invalid_from_validation(exc, "fence") from None
        except errors.WorkloadError as exc:
            raise _under("fence", exc) from None
    if not isinstance(fence, Fence):
        raise _invalid("fence", "must be a Fence (claim_id, worker_id, token)")
    workload = as_name(workload_id, "workload_id")
    key = _WHOLE_WORKLOAD if resource is None else as_name(resource, "resource")
    if fence.token < 1:
        raise _invalid("fence.token", "fencing tokens start at 1")
    if fence.claim_id != claim_id_for(workload, fence.token, fence.worker_id):
        raise _invalid(
            "fence.claim_id",
            "is not the claim id of this workload, token and worker (a fence of another workload?)",
        )
    return fence, workload, key


def _stale(
    workload_id: str, resource: str, fence: Fence, seen: Sequence[Any] | None
) -> errors.WorkloadError:
    # The record is there: the statement that refused the fence conflicted on it.
    token, claim_id = (int(seen[0]), str(seen[1])) if seen is not None else (fence.token, "")
    reason = "a higher fencing token" if token > fence.token else "another claim with this token"
    return errors.WorkloadError(
        errors.STALE_FENCE,
        f"the resource has seen {reason}: the claim presented is no longer the workload's",
        {
            "workload_id": workload_id,
            "resource": resource or None,
            "presented_token": fence.token,
            "presented_claim_id": fence.claim_id,
            "highest_token": token,
            "highest_claim_id": claim_id,
        },
    )


def _not_the_guards(problem: str) -> errors.WorkloadError:
    """`WORKLOAD_INVALID` naming `conn`: its `workwarden_fences` is not the table `guard` keeps."""
    error = _invalid(
        "conn",
        f"the table {FENCE_TABLE} is not the one the guard keeps: {problem}"
        " (its statement is in docs/fence.md, 'The table')",
    )
    assert error.details is not None
    error.details["table"] = FENCE_TABLE
    return error


def _shape_problem(
    columns: Sequence[tuple[str, str, bool]],
    unique: Sequence[tuple[bool, Sequence[str | None]]],
) -> str | None:
    """What makes a table of `columns` (name, kind, required) and `unique` keys (usable as
    the conflict arbiter, column names) unfit for the guard; None when it is fit.

    It needs the guard's columns, of text and of integers, no other column an
    insert must fill, a unique key on exactly (workload_id, resource), and no
    unique key of the guard's columns alone without both of those (it would
    refuse another workload's or resource's row).
    """
    kinds = {name: kind for name, kind, _ in columns}
    for name, want in _COLUMNS.items():
        if name not in kinds:
            return f"it has no column {name}"
        if kinds[name] != want:
            held = "any token (BIGINT on PostgreSQL)" if want == "integers" else "any id as text"
            return f"its column {name} is of type {kinds[name]}, which does not hold {held}"
    for name, _, required in columns:
        if required and name not in _COLUMNS:
            return (
                f"its column {name} is NOT NULL without a default, and the guard does not fill it"
            )
    keys = [(arbiter, frozenset(names)) for arbiter, names in unique]
    if not any(arbiter and names == _KEY for arbiter, names in keys):
        return "it has no primary key or unique constraint on (workload_id, resource)"
    for _, names in keys:
        if names <= _COLUMNS.keys() and not _KEY.issubset(names):
            listed = ", ".join(sorted(str(name) for name in names))
            return f"its unique key on ({listed}) would refuse other workloads' or resources' rows"
    return None


def _sqlite_affinity(declared: str) -> str:
    """The kind of value a SQLite column of the `declared` type keeps (its affinity)."""
    upper = declared.upper()
    if "INT" in upper:
        return "integers"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not upper or "BLOB" in upper:
        return "text"  # no affinity: text is stored as it is given
    return declared  # REAL or NUMERIC: text that looks like a number is stored as one


def _check_sqlite_shape(conn: sqlite3.Connection) -> None:
    cursor = _tuples(conn)
    rows = cursor.execute(_SQLITE_COLUMNS, (FENCE_TABLE,)).fetchall()
    columns = [
        (str(name), _sqlite_affinity(str(declared or "")), bool(notnull) and default is None)
        for name, declared, notnull, default, _ in rows
    ]
    primary = [str(name) for name, _, _, _, pk in sorted(rows, key=lambda row: row[4]) if pk]
    # An INTEGER PRIMARY KEY is the rowid and has no index of its own.
    unique: list[tuple[bool, list[str | None]]] = [(True, list(primary))] if primary else []
    indexes: dict[str, tuple[bool, list[str | None]]] = {}
    for index, partial, column in cursor.execute(_SQLITE_UNIQUE, (FENCE_TABLE,)).fetchall():
        indexes.setdefault(str(index), (not partial, []))[1].append(column)
    unique.extend(indexes.values())
    problem = _shape_problem(columns, unique)
    if problem is not None:
        raise _not_the_guards(problem)


def _postgres_shape(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row: tuple[Any, ...] = _tuples(conn).execute(_POSTGRES_SHAPE, (FENCE_TABLE,)).fetchone()
    return row


def _check_postgres_shape(row: tuple[Any, ...]) -> None:
    _, relkind, columns, unique = row
    if relkind not in ("r", "p"):
        raise _not_the_guards("it is not a table")
    problem = _shape_problem(
        [(str(name), str(kind), bool(required)) for name, kind, required in columns or []],
        [(bool(arbiter), list(names or [])) for arbiter, names in unique or []],
    )
    if problem is not None:
        raise _not_the_guards(problem)


def _is_postgres(conn: object) -> TypeGuard[psycopg.Connection[Any]]:
    """Whether `conn` is a synchronous psycopg connection (never, without psycopg)."""
    return _HAS_PSYCOPG and isinstance(conn, psycopg.Connection)


def _tuples(conn: sqlite3.Connection | psycopg.Connection[Any]) -> Any:
    """A cursor of `conn` whose rows are plain tuples, whatever row factory the caller set
    on the connection (`dict_row`, `sqlite3.Row`, their own): the guard reads by position.
    On psycopg a `Cursor` (`%s` placeholders), whatever cursor class the connection makes
    (a `RawCursor` takes `$1`)."""
    if isinstance(conn, sqlite3.Connection):
        cursor = conn.cursor()
        cursor.row_factory = None
        return cursor
    return psycopg.Cursor(conn, row_factory=tuple_row)


def forget(
    conn: sqlite3.Connection | psycopg.Connection[Any],
    workload_id: str,
) -> int:
    """Delete every record `guard` keeps for `workload_id` (all its resources); how many.

    To drop the records of work that is gone, in the caller's own
    transaction, for example from `Authority.purge(export=...)`; or after
    restoring the authority's store from an older backup, which issues
    tokens the records have seen. A workload purged and admitted again does
    not need it: its tokens continue past its purged namesake's.
    `WORKLOAD_INVALID` for a connection of another kind or a closed one, or
    a bad id.
    """
    workload = as_name(workload_id, "workload_id")
    _usable(conn)  # refuses a connection of another kind
    if isinstance(conn, sqlite3.Connection):
        sql = f"DELETE FROM {FENCE_TABLE} WHERE workload_id = ?"
        return _sqlite_first(conn, lambda cursor: int(cursor.execute(sql, (workload,)).rowcount))
    ensure_fence_table(conn)
    sql = f"DELETE FROM {FENCE_TABLE} WHERE workload_id = %s"
    return int(_tuples(conn).execute(sql, (workload,)).rowcount)


def _usable(conn: object) -> None:
    """`WORKLOAD_INVALID` for a connection of another kind, one already closed, or a
    sqlite3 one this thread may not use."""
    if isinstance(conn, sqlite3.Connection):
        try:
            _ = conn.in_transaction  # raises once the connection is closed
            closed = False
        except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
            closed = True
        if not closed:
            try:
                conn.cursor().close()  # raises in another thread than the connection's
            except sqlite3.ProgrammingError:
                raise _invalid(
                    "conn",
                    "was made in another thread: connect in the thread that uses it (a"
                    " handler's own), or with check_same_thread=False",
                ) from None
    elif _is_postgres(conn):
        closed = conn.closed
    else:
        raise _invalid("conn", "must be a sqlite3.Connection or a psycopg.Connection")
    if closed:
        raise _invalid("conn", "the connection is closed")


def _sqlite_in_transaction(conn: sqlite3.Connection) -> bool:
    # With `isolation_level=None`, or Python 3.12's `autocommit=True` (which
    # overrides it), the module never begins a transaction, so the guard's
    # row would commit alone unless the caller began one.
    if conn.in_transaction:
        return True
    if getattr(conn, "autocommit", None) is True:
        return False
    return conn.isolation_level is not None


def _postgres_in_transaction(conn: psycopg.Connection[Any]) -> bool:
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not (conn.autocommit and idle)


def ensure_fence_table(conn: sqlite3.Connection | psycopg.Connection[Any]) -> None:
    """Create the table `workwarden_fences` if it is missing (`guard` calls this itself).

    For a deployment that creates its schema ahead of time: the statement is
    in `docs/fence.md`. On PostgreSQL the table is made in the first schema of
    the connection's `search_path`; concurrent first uses take a
    transaction-scoped advisory lock so that only one creates it. The creation
    is part of the caller's transaction when one is open. A table of that
    name that is already there is checked: one of another shape (a token
    that is not an integer, no unique key on the workload and resource, a
    column the guard cannot fill...) is `WORKLOAD_INVALID` naming `conn`.
    `WORKLOAD_INVALID` too for a connection of another kind or one already
    closed.
    """
    _usable(conn)
    if isinstance(conn, sqlite3.Connection):
        conn.execute(_SQLITE_TABLE)
        _check_sqlite_shape(conn)
        return
    if _is_postgres(conn):
        row = _postgres_shape(conn)
        if not row[0]:
            # In autocommit outside a transaction the lock would be released
            # before the creation: both run in a transaction of their own.
            alone = not _postgres_in_transaction(conn)
            with conn.transaction() if alone else contextlib.nullcontext():
                _tuples(conn).execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
                _tuples(conn).execute(_POSTGRES_TABLE)
            # Another process may have made it first, and not as the guard does.
            row = _postgres_shape(conn)
        if row[1] is None:
            # On the search path, but made by another transaction after this
            # one's snapshot (REPEATABLE READ or SERIALIZABLE): its catalog
            # rows cannot be read here. Made concurrently, it is most likely
            # another first use of the guard; the next transaction checks it.
            return
        _check_postgres_shape(row)
        return
    raise _invalid("conn", "must be a sqlite3.Connection or a psycopg.Connection")


_SAVEPOINT = "workwarden_guard"
_T = TypeVar("_T")


def _sqlite_first(conn: sqlite3.Connection, run: Callable[[sqlite3.Cursor], _T]) -> _T:
    """`run(cursor)`, the guard's write to its table on `conn`, with the table made or checked.

    In a transaction already open, which may hold no lock yet (`BEGIN`, or
    Python 3.12's `autocommit=False`), the write is the first statement: a
    read first would fix the snapshot the write must then upgrade from, and a
    writer committing in between would fail it with "database is locked",
    however long the timeout. The write runs in a savepoint, the table's
    shape read after it; a table of another shape undoes it.
    """
    cursor = _tuples(conn)
    if not conn.in_transaction:
        # The sqlite3 module begins the transaction at the write: what is read
        # before it runs apart, and fixes no snapshot.
        ensure_fence_table(conn)
        return run(cursor)
    cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        try:
            result = run(cursor)
        except sqlite3.Error as exc:
            cursor.execute(f"ROLLBACK TO {_SAVEPOINT}")
            # Missing, the table is made here: a write, the transaction's first
            # lock, waited for while another first use makes it (a read first
            # would fail once that one commits).
            conn.execute(_SQLITE_TABLE)
            _check_sqlite_shape(conn)  # a table of another shape, refused
            if "no such table" not in str(exc):
                raise  # the guard's table: the database's own error (a lock timeout)
            result = run(cursor)
        else:
            _check_sqlite_shape(conn)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # gone when the database rolled back
            cursor.execute(f"ROLLBACK TO {_SAVEPOINT}")
            cursor.execute(f"RELEASE {_SAVEPOINT}")
        raise
    cursor.execute(f"RELEASE {_SAVEPOINT}")
    return result


def guard(
    conn: sqlite3.Connection | psycopg.Connection[Any],
    fence: Fence | Mapping[str, Any],
    workload_id: str,
    *,
    resource: str | None = None,
) -> None:
    """Record `fence` as the highest seen for the workload, in the caller's transaction.

    Call it inside the transaction that makes the fenced write, before the
    write (`with conn: guard(conn, job.fence, job.workload_id);
    conn.execute(...)` on SQLite, `with conn.transaction(): ...` on
    psycopg). It raises `WORKLOAD_STALE_FENCE` when the database has already
    seen a higher token for the workload (and `resource`), or the same token
    from another claim; the caller's transaction should then roll back (a
    `with` block does so as the error leaves it), and nothing of it is
    written. Otherwise the token is recorded and commits with the write, or
    not at all.

    `resource` names a separate record within the workload (1 to 256
    printable characters): writes to different resources are ordered
    independently. Without it the workload has one record. Tokens of
    different workloads are never compared.

    `WORKLOAD_INVALID` (nothing written) for a connection of another kind
    or one already closed, a sqlite3 one made in another thread (without
    `check_same_thread=False`), one with no transaction open that commits each statement alone
    (`sqlite3` with `isolation_level=None` or `autocommit=True` outside
    `BEGIN`, psycopg in autocommit outside `transaction()`), a table
    `workwarden_fences` of another shape than the guard's, a malformed fence, or a fence whose
    claim id is not derived from `workload_id` (a fence of another workload).
    Errors of the database itself (a lock timeout, a serialization failure)
    propagate as the driver raises them.
    """
    checked, workload, key = _checked(fence, workload_id, resource)
    _usable(conn)
    params = (workload, key, checked.token, checked.claim_id, checked.worker_id)
    if isinstance(conn, sqlite3.Connection):
        if not _sqlite_in_transaction(conn):
            raise _invalid("conn", "no transaction is open: begin one around the fenced write")
        advance = _ADVANCE.format(p="?")
        accepted = _sqlite_first(conn, lambda cursor: cursor.execute(advance, params).fetchone())
        if accepted is None:
            seen = _tuples(conn).execute(_SEEN.format(p="?"), (workload, key)).fetchone()
            raise _stale(workload, key, checked, seen)
        return
    if _is_postgres(conn):
        if not _postgres_in_transaction(conn):
            raise _invalid(
                "conn", "no transaction is open: use conn.transaction() around the write"
            )
        ensure_fence_table(conn)
        accepted = _tuples(conn).execute(_ADVANCE.format(p="%s"), params).fetchone()
        if accepted is None:
            seen = _tuples(conn).execute(_SEEN.format(p="%s"), (workload, key)).fetchone()
            raise _stale(workload, key, checked, seen)
        return
    raise _invalid("conn", "must be a sqlite3.Connection or a psycopg.Connection")


@dataclass(frozen=True)
class FencedCall:
    """What a `Workwarden-Fence` header carries: the workload and the fence of its claim."""

    workload_id: str
    fence: Fence


def _encode(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _decode(part: str, field: str) -> str:
    if not _ENCODED_ID.fullmatch(part):
        raise _invalid(field, "must be percent-encoded (RFC 3986 unreserved characters and %XX)")
    try:
        text = urllib.parse.unquote(part, errors="strict")
    except UnicodeDecodeError:
        raise _invalid(field, "does not decode as UTF-8") from None
    return as_name(text, field)


def format_fence_header(workload_id: str, fence: Fence | Mapping[str, Any]) -> str:
    """The value of the `Workwarden-Fence` header for `fence`, a claim of `workload_id`.

    `<workload_id>;<claim_id>;<worker_id>;<token>`: the three ids
    percent-encoded (every byte of their UTF-8 but `A-Z a-z 0-9 - . _ ~` as
    `%XX`), the token in decimal. `WORKLOAD_INVALID` for a malformed fence or
    one of another workload.
    """
    checked, workload, _ = _checked(fence, workload_id, None)
    return ";".join(
        (
            _encode(workload),
            _encode(checked.claim_id),
            _encode(checked.worker_id),
            str(checked.token),
        )
    )


def parse_fence_header(value: str | bytes | None) -> FencedCall:
    """The workload and fence a `Workwarden-Fence` header value carries.

    Surrounding spaces and tabs are ignored. `WORKLOAD_INVALID` (with the
    part named in `details["field"]`) for a missing header, a value that is
    not four `;`-separated parts, an id that is not percent-encoded UTF-8 of a
    name, a token that is not a positive decimal integer without leading
    zeros (at most 2^53 - 1), or a claim id not derived from the rest.
    """
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise _invalid(FENCE_HEADER, "must be ASCII") from None
    if value is None:
        raise _invalid(FENCE_HEADER, "the header is missing")
    if not isinstance(value, str):
        raise _invalid(FENCE_HEADER, "must be text")
    if len(value) > _MAX_HEADER_CHARS:
        raise _invalid(FENCE_HEADER, f"is longer than {_MAX_HEADER_CHARS} characters")
    parts = value.strip(" \t").split(";")
    if len(parts) != 4:
        raise _invalid(FENCE_HEADER, "must be <workload_id>;<claim_id>;<worker_id>;<token>")
    workload_id = _decode(parts[0], "workload_id")
    claim_id = _decode(parts[1], "fence.claim_id")
    worker_id = _decode(parts[2], "fence.worker_id")
    if not _TOKEN.fullmatch(parts[3]) or int(parts[3]) > 2**53 - 1:
        raise _invalid("fence.token", "must be a decimal integer from 1 to 2^53 - 1")
    fence = Fence(claim_id=claim_id, worker_id=worker_id, token=int(parts[3]))
    checked, workload, _ = _checked(fence, workload_id, None)
    return FencedCall(workload_id=workload, fence=checked)


class FenceRecord(Protocol):
    """Where the receiving side keeps the highest token it has seen per workload and resource."""

    def advance(self, workload_id: str, fence: Fence, resource: str | None) -> None:
        """Record `fence`, or raise `WORKLOAD_STALE_FENCE` when it is superseded here."""
        ...


class MemoryFenceRecord:
    """The highest tokens seen, in this process's memory; safe to share between threads.

    Forgotten when the process ends, so it protects only a receiver that does
    not restart, or whose writes do not outlive it; a receiver that stores
    what it is sent keeps the record beside it (`SqlFenceRecord`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[int, str]] = {}

    def advance(self, workload_id: str, fence: Fence, resource: str | None = None) -> None:
        """Record `fence`; `WORKLOAD_STALE_FENCE` for a lower token or another claim's."""
        checked, workload, key = _checked(fence, workload_id, resource)
        with self._lock:
            seen = self._seen.get((workload, key))
            if seen is not None and (
                checked.token < seen[0]
                or (checked.token == seen[0] and checked.claim_id != seen[1])
            ):
                raise _stale(workload, key, checked, seen)
            self._seen[(workload, key)] = (checked.token, checked.claim_id)


class SqlFenceRecord:
    """The highest tokens seen, in the receiver's own database, through `guard`.

    `advance` must run inside the transaction that makes the receiver's write
    (on the same connection), so the record and the write commit together.
    """

    def __init__(self, conn: sqlite3.Connection | psycopg.Connection[Any]) -> None:
        self.conn = conn

    def advance(self, workload_id: str, fence: Fence, resource: str | None = None) -> None:
        """`guard(self.conn, fence, workload_id, resource=resource)`."""
        guard(self.conn, fence, workload_id, resource=resource)


class FenceChecker:
    """The receiving side of the header: parse it, then apply the highest-seen rule.

    `record` defaults to a `MemoryFenceRecord` of this checker's own.
    """

    def __init__(self, record: FenceRecord | None = None) -> None:
        self.record: FenceRecord = MemoryFenceRecord() if record is None else record

    def check(self, value: str | bytes | None, *, resource: str | None = None) -> FencedCall:
        """The call's workload and fence, once recorded; refuses as `parse_fence_header` and
        `FenceRecord.advance` do (`WORKLOAD_INVALID`, `WORKLOAD_STALE_FENCE`)."""
        call = parse_fence_header(value)
        self.record.advance(call.workload_id, call.fence, resource)
        return call
