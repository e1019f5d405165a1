"""The canonical codec's refusals (SPEC R9.5), unit by unit; what they do to a running flow is
in ``test_unstorable_values.py``."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from datetime import UTC, datetime
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from flowx import codec
from flowx.errors import SerialisationError


class Colour(StrEnum):
    RED = "red"


class Line(BaseModel):
    sku: str
    price: Decimal
    tags: set[str] = set()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_plain_values_are_encoded_exactly_as_before() -> None:
    """R9.5 adds checks, never a change of bytes: the fast path is the same encoder."""
    value = {"b": [1, 2.5, None, True, "é", {"z": 10**30}], "a": "x\x00y", "c": -0.0}
    assert codec.dumps(value) == canonical(value)
    assert codec.dumps((1, "two")) == '[1,"two"]'


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_the_encoder_built_once_writes_the_bytes_json_writes(value: Any) -> None:
    """The codec builds its C encoder once instead of per call (issue 14): any JSON value
    still comes out exactly as ``json.dumps`` with the canonical settings writes it."""
    assert codec.dumps(value) == canonical(value)


def test_declared_types_go_through_their_serialiser() -> None:
    """Models, datetimes, UUIDs, Decimals, enums, str-subclass keys: the documented inputs."""
    value = {
        "line": Line(sku="A", price=Decimal("1.10"), tags={"only"}),
        "at": datetime(2024, 5, 1, tzinfo=UTC),
        "id": UUID(int=1),
        "colour": Colour.RED,
        "by_colour": OrderedDict({Colour.RED: 1}),
    }
    assert json.loads(codec.dumps(value)) == {
        "line": {"sku": "A", "price": "1.10", "tags": ["only"]},
        "at": "2024-05-01T00:00:00Z",
        "id": "00000000-0000-0000-0000-000000000001",
        "colour": "red",
        "by_colour": {"red": 1},
    }


def test_a_value_that_contains_itself_is_refused_with_a_short_path() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerialisationError) as refused:
        codec.dumps({"loop": loop}, root="result")
    assert "contains itself" in str(refused.value)
    assert refused.value.path is not None and refused.value.path.startswith("result.loop[0]")
    assert refused.value.path.endswith("...") and len(refused.value.path) < 60


@pytest.mark.parametrize(
    ("key", "says"),
    [("a\x00b", "NUL character at index 1"), ("ab\ud800", "lone surrogate '\\ud800' at index 2")],
)
def test_text_for_a_text_column_refuses_nul_and_surrogates(key: str, says: str) -> None:
    assert codec.text("plain key é", root="key") == "plain key é"
    with pytest.raises(SerialisationError) as refused:
        codec.text(key, root="key", code="signal.payload_unstorable", context="signal 's'")
    assert refused.value.code == "signal.payload_unstorable"
    assert refused.value.path == "key"
    assert str(refused.value).startswith("signal 's' cannot be stored: key ")
    assert says in str(refused.value)


def test_an_error_message_quoting_an_unstorable_value_is_itself_storable() -> None:
    message = codec.printable("bad value 'x\ud800' in é")
    assert message == "bad value 'x\\ud800' in é"
    assert codec.dumps({"message": message})  # does not raise


class Number(IntEnum):
    ONE = 1


@pytest.mark.parametrize(
    "value",
    [0, -1, 10**18 - 1, -(10**18) + 1, 10**18, -(10**18), 10**40, True, False, Number.ONE],
)
def test_an_int_is_written_as_the_encoder_writes_it(value: Any) -> None:
    """A plain ``int`` below 10**18 skips the scan and the encoder (a step's usual result,
    issue 14); the text is the encoder's, and a ``bool`` or an ``IntEnum`` goes the usual way."""
    assert codec.dumps(value) == canonical(value)
    assert codec.dumps([value]) == canonical([value])


def test_an_int_longer_than_python_writes_as_text_is_still_refused() -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(SerialisationError, match="cannot be stored as JSON"):
            codec.dumps(10**700)
    finally:
        sys.set_int_max_str_digits(limit)


class Tight(BaseModel):
    n: int = 1


class Loose(BaseModel):
    anything: Any = None


def test_a_models_scan_is_remembered_only_where_it_cannot_change() -> None:
    """The scan remembers a model class with no loose field (its value alone is declared,
    whatever it holds); one with a loose field is checked anew every time."""
    for _ in range(2):
        assert codec._scan(Tight(n=2)) == codec._HAS_DECLARED
        assert codec.dumps(Tight(n=2)) == '{"n":2}'
        assert codec._scan(Loose(anything=b"x")) == codec._HAS_LOOSE
        with pytest.raises(SerialisationError, match="bytes"):
            codec.dumps(Loose(anything=b"x"))
    assert Tight in codec._TIGHT and Loose not in codec._TIGHT
    assert codec._scan([Tight(), b"x"]) == codec._SUSPECT  # inside a container: walked
