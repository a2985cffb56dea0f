"""Refusing plaintext secrets and oversized or malformed JSON before anything is decided.

The patterns and limits are data (`[secrets]` and `[limits]` in the spec).
The walk is iterative, so hostile nesting cannot exhaust the interpreter's
stack before the depth limit refuses it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import string
from typing import TYPE_CHECKING, Any

import pydantic_core

from workwarden.statemachine import errors
from workwarden.statemachine.identity import ByIdentity

if TYPE_CHECKING:
    from workwarden.statemachine.spec import Spec

__all__ = [
    "as_interrupt",
    "ascii_lower",
    "canonical_json",
    "check_json",
    "check_text",
    "digest",
    "json_depth",
    "text_digest",
]


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ascii_lower(text: str) -> str:
    """`text` with A-Z lowered and nothing else changed, as the seed compares secret keys."""
    return text.translate(_ASCII_LOWER)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


# What pydantic-core makes of a KeyboardInterrupt or a SystemExit raised (by a signal
# handler: Ctrl-C, or SIGTERM under the command line) while it serialises: its own error,
# with the interrupt's name and argument in the message and nowhere else.
_INTERRUPTED = re.compile(r"^Error serializing to JSON: (KeyboardInterrupt|SystemExit)(?:: (.*))?$")


def as_interrupt(exc: pydantic_core.PydanticSerializationError) -> BaseException:
    """The KeyboardInterrupt or SystemExit a signal raised inside pydantic-core's
    serialiser, which reports it as a `PydanticSerializationError`; else `exc` itself.

    Raise what this returns, so that a signal that lands while a document is serialised
    stops the program as it would anywhere else, not as a serialisation error.
    """
    found = _INTERRUPTED.match(str(exc))
    if found is None:
        return exc
    if found.group(1) == "KeyboardInterrupt":
        return KeyboardInterrupt()
    code = found.group(2)
    return SystemExit(int(code) if code is not None and code.lstrip("-").isdigit() else code)


def _canonical(value: Any, has_float: bool) -> str:
    if not has_float:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    # Floats as serde_json writes them, as the seed hashed them: the shortest
    # round-trip digits, fixed notation for exponents -5 to 15 (`0.00001`),
    # else `1.5e-7` / `1e+16`. Python's own form (`1e-05`) would hash differently.
    try:
        return pydantic_core.to_json(_sorted(value)).decode("utf-8")
    except pydantic_core.PydanticSerializationError as exc:
        raise as_interrupt(exc) from None


def _floats(value: Any) -> list[float]:
    out: list[float] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float):
            out.append(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept, floats as serde_json writes them: what is hashed.

    The recipe, byte for byte, is in docs/design.md ("Ids and hashes").
    """
    floats = _floats(value)
    if not all(math.isfinite(number) for number in floats):
        raise ValueError("Out of range float values are not JSON compliant")
    return _canonical(value, bool(floats))


def json_depth(value: Any) -> int:
    """How deep `value` nests (a scalar: 1), counted a level at a time, not by recursion."""
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [
            child
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
        ]
    return depth


def digest(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of `value`."""
    return text_digest(canonical_json(value))


def text_digest(canonical: str) -> str:
    """SHA-256 (hex) of canonical JSON text already made (`check_json` returns it)."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _sensitive(spec: Spec, text: str) -> bool:
    for pattern in spec.secrets.forbidden_text:
        if pattern.contains is not None and pattern.contains in text:
            return True
        if pattern.prefix is not None and text.startswith(pattern.prefix):
            return True
    return False


def check_text(spec: Spec, text: str, what: str) -> None:
    """Refuse free text (an error message, a reason) that carries secret material."""
    if _sensitive(spec, text):
        raise errors.WorkloadError(
            errors.SECRET_REJECTED, f"{what} may not contain secret material", {"field": what}
        )


#: The forbidden keys of the specs checked lately, lowered once each, by the
#: spec's `[secrets]` table.
_LOWERED: ByIdentity[Any, frozenset[str]] = ByIdentity(64)


def _forbidden_keys(spec: Spec) -> frozenset[str]:
    """`[secrets] forbidden_keys` with A-Z lowered, as every JSON key is compared."""
    lowered = _LOWERED.get(spec.secrets)
    if lowered is None:
        lowered = frozenset(ascii_lower(key) for key in spec.secrets.forbidden_keys)
        _LOWERED.put(spec.secrets, lowered)
    return lowered


def check_json(spec: Spec, value: Any, what: str) -> str:
    """Refuse caller JSON too deep, too large, not finite, not Unicode, or holding a secret.

    Returns the canonical JSON text of `value` it measured, so a caller that
    also needs its digest does not serialise it twice.
    """
    forbidden = _forbidden_keys(spec)
    max_depth = spec.limits.max_json_depth
    has_float = False
    stack: list[tuple[Any, int, str]] = [(value, 1, what)]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise errors.WorkloadError(
                errors.INVALID,
                f"{what} is nested deeper than {max_depth} levels",
                {"field": path, "max_depth": max_depth},
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise errors.WorkloadError(
                        errors.INVALID, f"{what} has a non-string key", {"field": path}
                    )
                if ascii_lower(key) in forbidden:
                    raise errors.WorkloadError(
                        errors.SECRET_REJECTED,
                        "plaintext secrets are forbidden in workload state",
                        {"field": f"{path}.{key}"},
                    )
                stack.append((child, depth + 1, f"{path}.{key}"))
        elif isinstance(node, list):
            for index, child in enumerate(node):
                stack.append((child, depth + 1, f"{path}[{index}]"))
        elif isinstance(node, str):
            if _sensitive(spec, node):
                raise errors.WorkloadError(
                    errors.SECRET_REJECTED,
                    "plaintext secrets are forbidden in workload state",
                    {"field": path},
                )
        elif isinstance(node, float):
            has_float = True
            if not math.isfinite(node):
                raise errors.WorkloadError(
                    errors.INVALID, f"{what} holds a number that is not finite", {"field": path}
                )
        elif node is not None and not isinstance(node, (bool, int)):
            raise errors.WorkloadError(
                errors.INVALID, f"{what} holds a value that is not JSON", {"field": path}
            )
    try:
        text = _canonical(value, has_float)
        size = len(text.encode("utf-8"))
    except (UnicodeEncodeError, pydantic_core.PydanticSerializationError):
        # A lone surrogate: Python text that is not Unicode, which no
        # backend can store and no digest can be taken of.
        raise errors.WorkloadError(
            errors.INVALID, f"{what} holds text that is not valid Unicode", {"field": what}
        ) from None
    except ValueError:
        # An integer longer than the interpreter writes as text (4,300 digits
        # unless `sys.set_int_max_str_digits` says otherwise).
        raise errors.WorkloadError(
            errors.INVALID, f"{what} holds an integer too long to write", {"field": what}
        ) from None
    if size > spec.limits.max_json_bytes:
        raise errors.WorkloadError(
            errors.INVALID,
            f"{what} is {size} bytes, over the limit of {spec.limits.max_json_bytes}",
            {"field": what, "bytes": size, "max_bytes": spec.limits.max_json_bytes},
        )
    return text
