"""A model field typed ``Any`` (or ``object``, or an extra field) is serialised by pydantic
by guessing from the value: NaN became null, bytes text, a set a list, an int key a str key,
and the codec trusted it, so stored data changed quietly. No declared type reads such a
field back, so the codec now checks it as a raw value (SPEC R9.5; issue 12 item 11)."""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime
from typing import Annotated, Any, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field

from flowx import codec, codec_checks
from flowx.errors import SerialisationError


class Inner(BaseModel):
    anything: dict[str, Any] = {}
    keyed: dict[int, Any] = {}
    maybe: Optional[list[Any]] = None  # noqa: UP045 - the Optional spelling on purpose
    pair: tuple[Any, ...] = ()


class Outer(BaseModel):
    loose: Any = None
    thing: object = None
    ratio: float = 0.0
    blob: bytes = b""
    tags: set[int] = set()
    by_id: dict[int, str] = {}
    inner: list[Inner] = []
    when: datetime | None = None
    tagged: Annotated[Any, Field(description="loose too")] = None


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclasses.dataclass
class Record:
    loose: Any = None
    blob: bytes = b""
    items: list[Any] = dataclasses.field(default_factory=list)


class Holder(BaseModel):
    record: Record | None = None


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        (Outer(loose=float("nan")), "value.loose", "is nan"),
        (Outer(loose=b"ab"), "value.loose", "is bytes"),
        (Outer(thing={3, 1}), "value.thing", "is a set"),
        (Outer(loose={1: "a"}), "value.loose", "has the key 1 (int)"),
        (Outer(loose=[Outer(loose=b"x")]), "value.loose[0].loose", "is bytes"),
        (Outer(inner=[Inner(anything={"a": float("inf")})]), "value.inner[0].anything.a", "inf"),
        (Outer(inner=[Inner(keyed={1: b"a"})]), "value.inner[0].keyed[1]", "is bytes"),
        (Outer(inner=[Inner(maybe=[{2}])]), "value.inner[0].maybe[0]", "is a set"),
        (Outer(inner=[Inner(pair=(1, float("nan")))]), "value.inner[0].pair[1]", "is nan"),
        (Outer(tagged=float("-inf")), "value.tagged", "is -inf"),
        (Extra(z=b"x"), "value.z", "is bytes"),
        ({"wrapped": Outer(loose=float("nan"))}, "value.wrapped.loose", "is nan"),
        (Outer(ratio=float("nan")), "value.ratio", "is nan"),
        (Record(loose=b"x"), "value.loose", "is bytes"),
        (Record(items=[{1: "a"}]), "value.items[0]", "has the key 1 (int)"),
        (Holder(record=Record(loose={2})), "value.record.loose", "is a set"),
    ],
)
def test_a_loose_field_is_checked_as_a_raw_value(value: Any, path: str, says: str) -> None:
    with pytest.raises(SerialisationError) as caught:
        codec.dumps(value)
    assert caught.value.path == path
    assert says in str(caught.value)


def test_declared_types_keep_their_own_serialiser() -> None:
    """bytes, sets and int keys a field declares are the contract: validation reads them
    back as declared, so they are stored as pydantic writes them."""
    value = Outer(
        blob=b"ok",
        tags={3, 1},
        by_id={1: "a"},
        inner=[Inner(keyed={2: "b"}, anything={"k": [1, "x"]})],
        loose={"plain": [1, 2.5, None]},
    )
    text = codec.dumps(value)
    assert Outer.model_validate_json(text) == value
    assert codec.dumps(Record(blob=b"ok", loose=[1])) == '{"blob":"ok","items":[],"loose":[1]}'


def test_a_model_with_no_loose_field_is_not_walked() -> None:
    class Plain(BaseModel):
        n: int = 0
        s: list[str] = []

    @dataclasses.dataclass
    class PlainRecord:
        n: int = 0

    assert not codec_checks.has_loose_fields(Plain) and not codec_checks.has_loose_fields(
        PlainRecord
    )
    assert codec_checks.has_loose_fields(Outer) and codec_checks.has_loose_fields(Extra)
    assert codec_checks.has_loose_fields(Record) and codec_checks.has_loose_fields(Holder)


class Bare(BaseModel):
    table: dict = {}  # type: ignore[type-arg]
    items: list = []  # type: ignore[type-arg]
    spelled: typing.Dict = {}  # type: ignore[type-arg]  # noqa: UP006 - the typing spelling on purpose
    typed: dict[str, float] = {}


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        (Bare(table={"x": float("nan")}), "value.table.x", "is nan"),
        (Bare(table={"x": {3, 1}}), "value.table.x", "is a set"),
        (Bare(table={1: "a"}), "value.table", "has the key 1 (int)"),
        (Bare(items=[1, float("inf")]), "value.items[1]", "is inf"),
        (Bare(spelled={"b": b"x"}), "value.spelled.b", "is bytes"),
    ],
)
def test_a_container_declared_without_element_types_is_checked_as_loose(
    value: Any, path: str, says: str
) -> None:
    """A bare ``dict`` or ``list`` field leaves its contents to pydantic's guess as ``Any``
    does: NaN was stored as null, a set as a list, an int key as a str, without a word."""
    with pytest.raises(SerialisationError) as caught:
        codec.dumps(value)
    assert caught.value.path == path
    assert says in str(caught.value)


def test_a_bare_container_of_storable_values_is_stored_as_before() -> None:
    value = Bare(table={"at": datetime(2024, 5, 1), "pair": (1, 2)}, typed={"x": 1.5})
    assert codec.loads(codec.dumps(value)) == {
        "items": [],
        "spelled": {},
        "table": {"at": "2024-05-01T00:00:00", "pair": [1, 2]},
        "typed": {"x": 1.5},
    }
