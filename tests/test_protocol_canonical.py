"""The protocol's JSON reader (``protocol._canonical.parse_json_object``): its nesting bound, at the edge."""

from __future__ import annotations

import json

import pytest

from anonml.protocol import InvalidDocument
from anonml.protocol._canonical import MAX_JSON_DEPTH, parse_json_object


def nested(objects: int, innermost: object) -> bytes:
    """``objects`` objects each inside the last, ``innermost`` in the deepest (a scalar there counts one level more)."""
    value: object = innermost
    for _ in range(objects):
        value = {"a": value}
    return json.dumps(value).encode()


@pytest.mark.parametrize(("objects", "innermost", "depth"), [
    (MAX_JSON_DEPTH - 1, 1, MAX_JSON_DEPTH), (MAX_JSON_DEPTH, 1, MAX_JSON_DEPTH + 1),
    (MAX_JSON_DEPTH - 1, [], MAX_JSON_DEPTH), (MAX_JSON_DEPTH, [], MAX_JSON_DEPTH + 1),
    (MAX_JSON_DEPTH - 1, [1], MAX_JSON_DEPTH + 1), (MAX_JSON_DEPTH - 1, {}, MAX_JSON_DEPTH), (MAX_JSON_DEPTH, {}, MAX_JSON_DEPTH + 1),
    (1, "x", 2),
])
def test_a_document_nested_deeper_than_the_bound_is_refused_and_one_at_the_bound_is_read(objects: int, innermost: object, depth: int) -> None:
    data = nested(objects, innermost)
    if depth > MAX_JSON_DEPTH:
        with pytest.raises(InvalidDocument, match="nested deeper"):
            parse_json_object(data, max_bytes=len(data))
    else:
        assert parse_json_object(data, max_bytes=len(data)) == json.loads(data)


def test_siblings_do_not_add_up_to_depth() -> None:
    wide = json.dumps({"a": [{"b": [1, 2, {"c": []}]}] * 50, "d": {"e": [[[]]]}}).encode()
    assert parse_json_object(wide, max_bytes=len(wide))["d"] == {"e": [[[]]]}
