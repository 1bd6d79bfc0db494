"""Canonical JSON and strict field readers for the protocol's documents.

Every JSON document that crosses a trust boundary (the round manifest, the
HTTP API bodies) is parsed through :class:`FieldReader`, so each one is
bounded, total, and names the offending field when it rejects input.
Canonical encoding (sorted keys, no whitespace, ASCII only, no NaN) makes a
document's hash stable, which is what names a round (DESIGN.md §4).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

from anonml.base.display import one_of
from anonml.base.errors import InputError

MAX_JSON_DEPTH = 16
_HEX = re.compile(r"[0-9a-f]*")
_NAME = r"[A-Za-z0-9_.\-]+"


class InvalidDocument(InputError):
    """Raised by every strict protocol parser for malformed input.

    ``field`` is the dotted path of the offending field (``"schedule.data.t_r"``),
    or ``"$"`` for the document as a whole.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, ASCII only; floats are refused unless finite."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests, a scalar inside one object counting 2 (exact up to ``limit``, then any larger value).

    Iterative so a deeply nested hostile document cannot exhaust the stack.
    Only containers are stacked: a non-empty one makes its children one level
    deeper, whatever they are, so scalars need no visit of their own (every
    response a peer reads passes here: visiting each scalar cost more than
    the JSON decoding).
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    deepest = 1
    while stack:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node if type(node) is list else ()
        if children:
            if depth >= deepest:
                deepest = depth + 1
                if deepest > limit:
                    return deepest
            stack.extend([(child, depth + 1) for child in children if type(child) is dict or type(child) is list])
    return deepest


def parse_json_object(
    data: bytes | str, *, max_bytes: int, error: type[InvalidDocument] = InvalidDocument
) -> dict[str, Any]:
    """Parse one JSON object of at most ``max_bytes``; raise ``error`` otherwise."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise error("$", f"document of {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        # json's own recursion guard raises RecursionError on absurd nesting.
        value = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise error("$", f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise error("$", f"expected a JSON object, got {type(value).__name__}")
    if _depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise error("$", f"nested deeper than {MAX_JSON_DEPTH}")
    return value


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-finite number {name!r} is not allowed")


def format_epsilon(value: float) -> str:
    """An epsilon as a canonical decimal string (shortest round-tripping repr).

    Epsilons are the only non-integers in the manifest; writing them as strings
    keeps the manifest hash independent of any JSON library's float printing.
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"epsilon must be a number, got {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float) or as_float < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {value!r}")
    return repr(as_float)


class FieldReader:
    """Reads the fields of one JSON object, checking each, naming failures.

    Call :meth:`done` after reading every field: unknown fields are rejected so
    two parsers cannot disagree about what a document says.
    """

    def __init__(self, obj: object, path: str, error: type[InvalidDocument]) -> None:
        self._error = error
        self._path = path
        if not isinstance(obj, dict):
            self.fail_at(path, f"expected an object, got {type(obj).__name__}")
        self._obj: dict[str, Any] = obj
        self._seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def fail_at(self, field: str, message: str) -> NoReturn:
        raise self._error(field or "$", message)

    def fail(self, key: str, message: str) -> NoReturn:
        self.fail_at(self.name(key), message)

    def raw(self, key: str, *, optional: bool = False) -> Any:
        self._seen.add(key)
        if key not in self._obj:
            if optional:
                return None
            self.fail(key, "missing")
        return self._obj[key]

    def child(self, key: str) -> FieldReader:
        return FieldReader(self.raw(key), self.name(key), self._error)

    def nested(self, value: object, field: str) -> FieldReader:
        """A reader for ``value`` (found at ``field``) raising this reader's exception type."""
        return FieldReader(value, field, self._error)

    def integer(self, key: str, lo: int, hi: int) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {value!r}")
        if not lo <= value <= hi:
            self.fail(key, f"{value!r} is outside [{lo}, {hi}]")
        return value

    def string(self, key: str, *, max_len: int, pattern: str | None = None, nullable: bool = False) -> str | None:
        """A string field; with ``nullable`` the key must still be present but may be null."""
        value = self.raw(key)
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {value!r}")
        if not 0 < len(value) <= max_len:
            self.fail(key, f"length {len(value)} is outside [1, {max_len}]")
        if pattern is not None and re.fullmatch(pattern, value) is None:
            self.fail(key, f"{value!r} does not match {pattern!r}")
        return value

    def text(self, key: str, *, max_len: int, pattern: str | None = None) -> str:
        value = self.string(key, max_len=max_len, pattern=pattern)
        assert value is not None
        return value

    def choice(self, key: str, options: tuple[str, ...]) -> str:
        value = self.raw(key)
        if value not in options:
            self.fail(key, f"{value!r} is not one of {one_of(options)}")
        assert isinstance(value, str)
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {value!r}")
        return value

    def hex_bytes(self, key: str, *, size: int | None = None, max_size: int = 4096, nullable: bool = False) -> bytes | None:
        value = self.raw(key)
        if value is None and nullable:
            return None
        return self.decode_hex(value, self.name(key), size=size, max_size=max_size)

    def hex(self, key: str, *, size: int | None = None, max_size: int = 4096) -> bytes:
        value = self.hex_bytes(key, size=size, max_size=max_size)
        assert value is not None
        return value

    def decode_hex(self, value: object, field: str, *, size: int | None = None, max_size: int = 4096) -> bytes:
        if not isinstance(value, str):
            self.fail_at(field, f"expected a lowercase hex string, got {value!r}")
        if len(value) > 2 * max_size or len(value) % 2 or _HEX.fullmatch(value) is None:
            self.fail_at(field, f"expected lowercase hex of at most {max_size} bytes, got {value[:80]!r}")
        decoded = bytes.fromhex(value)
        if size is not None and len(decoded) != size:
            self.fail_at(field, f"expected {size} bytes, got {len(decoded)}")
        return decoded

    def keys(self) -> list[str]:
        """The object's keys (every JSON object key is a string)."""
        return list(self._obj)

    def decode_text(self, value: object, field: str, *, max_len: int = 128, pattern: str = _NAME) -> str:
        if not isinstance(value, str) or not 0 < len(value) <= max_len or re.fullmatch(pattern, value) is None:
            self.fail_at(field, f"expected a name matching {pattern!r}, got {str(value)[:80]!r}")
        return value

    def number(self, key: str, lo: float, hi: float) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(key, f"expected a finite number, got {value!r}")
        if not lo <= value <= hi:
            self.fail(key, f"{value!r} is outside [{lo}, {hi}]")
        return float(value)

    def optional(self, key: str) -> bool:
        """Whether ``key`` is present (marks it as read)."""
        self._seen.add(key)
        return key in self._obj

    def epsilon(self, key: str) -> float:
        value = self.raw(key)
        if not isinstance(value, str) or len(value) > 32:
            self.fail(key, f"expected an epsilon as a decimal string, got {value!r}")
        try:
            parsed = float(value)
        except ValueError:
            self.fail(key, f"{value!r} is not a decimal number")
        if not math.isfinite(parsed) or parsed < 0 or repr(parsed) != value:
            self.fail(key, f"{value!r} is not a canonical non-negative epsilon (write it as {parsed!r})")
        return parsed

    def items(self, key: str, *, max_items: int) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {type(value).__name__}")
        if len(value) > max_items:
            self.fail(key, f"{len(value)} items exceed the limit of {max_items}")
        return value

    def obj(self, key: str) -> dict[str, Any]:
        value = self.raw(key)
        if not isinstance(value, dict):
            self.fail(key, f"expected an object, got {type(value).__name__}")
        return value

    def done(self) -> None:
        unknown = sorted(set(self._obj) - self._seen)
        if unknown:
            self.fail(unknown[0], "unknown field")
