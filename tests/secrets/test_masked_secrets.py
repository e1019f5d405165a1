"""A secret FlowX cannot seal is refused, never stored as pydantic's mask (R9.5, R9.8).

Where no declared type lets the sealer find a ``SecretStr`` — a field typed ``Any``, a ``dict``
or ``list`` without element types, a ``set``, a ``deque``, an extra field, a dict keyed by
ints, inside a member sealed whole — and for a ``pydantic.Secret[T]``, pydantic's serialiser
writes ``"**********"`` in its place: stored, the secret would be lost without a word. The
codec follows each mask in what it is about to store back into the value, and refuses the
value by the secret's path when a secret is there. Only then: a string that merely is the
mask, a secret a serialiser wrote out or left out, an empty secret are stored as before.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from enum import IntEnum
from typing import Annotated, Any, ClassVar

import pydantic
import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    RootModel,
    SecretBytes,
    SecretStr,
    computed_field,
    field_serializer,
    model_serializer,
)
from pydantic_core import to_jsonable_python
from typing_extensions import TypedDict

import flowx
from flowx import codec
from flowx.errors import SerialisationError
from flowx.plan.events import contract_of
from flowx.sealing import MARK, MASK, Keyring, Sealing, generate_key

SECRET = "s3cret-7731"


class Loose(BaseModel):
    anything: Any = None
    table: dict = {}  # type: ignore[type-arg]
    items: list = []  # type: ignore[type-arg]
    tags: set[Any] = set()
    queue: deque[SecretStr] = deque()
    pin: pydantic.Secret[int] | None = None
    declared: SecretStr | None = None
    note: str = ""


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = ""


class Row(BaseModel):
    value: Any = None


class Rows(BaseModel):
    rows: list[Row] = []


class Level(IntEnum):
    ONE = 1


class Keyed(BaseModel):
    by_int: dict[int, SecretStr] = {}
    by_enum: dict[Level, SecretStr] = {}
    by_secret: dict[SecretStr, int] = {}


@dataclasses.dataclass
class Holder:
    value: Any = None


class Marked(BaseModel):
    whole: flowx.Sensitive[Any] = None
    row: flowx.Sensitive[Row] | None = None


def _keys() -> Sealing:
    return Sealing(Keyring.parse(f"k1:{generate_key()}"), "i-1")


def _secret() -> SecretStr:
    return SecretStr(SECRET)


class Hidden(SecretStr):
    """A secret type of the application's that shows itself its own way: pydantic still
    writes the mask for it."""

    def __str__(self) -> str:
        return "<hidden>"


UNDECLARED = [
    ("an Any field", lambda: Loose(anything=_secret()), "state.anything"),
    ("secret bytes", lambda: Loose(anything=SecretBytes(b"s3cret")), "state.anything"),
    ("a subclass", lambda: Loose(items=[Hidden(SECRET)]), "state.items[0]"),
    ("a bare dict", lambda: Loose(table={"k": _secret()}), "state.table.k"),
    ("a key no name", lambda: Loose(table={"api-key": _secret()}), "state.table['api-key']"),
    ("a bare list", lambda: Loose(items=[1, _secret()]), "state.items[1]"),
    ("a set", lambda: Loose(tags={_secret()}), "state.tags[0]"),
    ("a deque", lambda: Loose(queue=deque([_secret()])), "state.queue[0]"),
    ("an extra field", lambda: Extra(name="x", token=_secret()), "state.token"),
    ("a dataclass's Any field", lambda: Holder(value=_secret()), "state.value"),
    ("a dict keyed by int", lambda: Keyed(by_int={1: _secret()}), "state.by_int['1']"),
    ("a dict keyed by enum", lambda: Keyed(by_enum={Level.ONE: _secret()}), "state.by_enum['1']"),
    ("a root model", lambda: RootModel[Any](_secret()), "state"),
    ("a root model's list", lambda: RootModel[list[Any]]([_secret()]), "state[0]"),
    (
        "a model in a declared list",
        lambda: Rows(rows=[Row(value=1), Row(value=_secret())]),
        "state.rows[1].value",
    ),
    (
        "a model in an Any field",
        lambda: Loose(anything=Row(value=_secret())),
        "state.anything.value",
    ),
    ("a model in a dict", lambda: {"inner": Loose(anything=_secret())}, "state.inner.anything"),
    ("in a member sealed whole", lambda: Marked(row=Row(value=_secret())), "state.row.value"),
]


@pytest.mark.parametrize("keys", [True, False], ids=["with-keys", "without-keys"])
@pytest.mark.parametrize(("what", "make", "path"), UNDECLARED, ids=[c[0] for c in UNDECLARED])
def test_a_secret_no_declared_type_lets_flowx_seal_is_refused_by_its_path(
    what: str, make: Any, path: str, keys: bool
) -> None:
    with codec.sealing(_keys() if keys else None), pytest.raises(SerialisationError) as caught:
        codec.dumps(make(), root="state")
    assert caught.value.path == path, what
    message = str(caught.value)
    assert message.startswith(f"{path} holds a secret FlowX cannot seal there")
    assert "'**********'" in message and "declare its type where it sits" in message
    assert SECRET not in message


def test_a_generic_secret_or_a_secret_key_is_refused_saying_what_to_use_instead() -> None:
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as generic:
        codec.dumps(Loose(pin=pydantic.Secret[int](4321)), root="input")
    assert generic.value.path == "input.pin"
    assert "is a pydantic Secret[...], which FlowX cannot seal" in str(generic.value)
    assert "declare it SecretStr or SecretBytes" in str(generic.value)
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as key:
        codec.dumps(Keyed(by_secret={_secret(): 1, SecretStr("other-secret"): 2}), root="input")
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as byte_key:
        codec.dumps(AnyKeyed(value={SecretBytes(b"s3cret"): 1}), root="input")
    assert byte_key.value.path == "input.value" and "has a secret as a key" in str(byte_key.value)
    assert key.value.path == "input.by_secret"
    assert "has a secret as a key" in str(key.value) and SECRET not in str(key.value)


def test_a_result_sealed_whole_is_refused_rather_than_sealing_the_mask() -> None:
    """A step's result bound for a sealed field is sealed whole: the mask inside it would be
    sealed, and lost unseen."""
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(
            Row(value={"token": _secret()}),
            root="result",
            whole=True,
            code="step.result_unstorable",
            context="step 'login': the result of auth.login@1",
        )
    assert caught.value.code == "step.result_unstorable"
    assert caught.value.path == "result.value.token"
    assert str(caught.value).startswith("step 'login': the result of auth.login@1 cannot be stored")


class Revealed(BaseModel):
    anything: Any = None
    note: str = ""

    @field_serializer("anything")
    def _reveal(self, v: Any) -> Any:
        return v.get_secret_value() if isinstance(v, SecretStr) else v


class Dropped(BaseModel):
    anything: Any = None
    note: str = ""

    @model_serializer
    def _drop(self) -> dict[str, Any]:
        return {"note": self.note}


class Replaced(BaseModel):
    anything: Annotated[Any, PlainSerializer(lambda v: "seen")] = None
    note: str = ""


def test_where_no_secret_was_masked_nothing_is_refused() -> None:
    """The mask as a plain string (alone, beside a sealed secret, in a plain dict), a secret
    a serialiser wrote out or left out, and an empty secret (written as ``""``): stored as
    they were before."""
    with codec.sealing(_keys()):
        alone = codec.dumps(Loose(anything=MASK, note=MASK), root="state")
        beside = codec.dumps(Loose(anything=MASK, declared=_secret()), root="state")
        plain = codec.dumps({"shown": MASK}, root="state")
        revealed = codec.dumps(Revealed(anything=_secret(), note=MASK), root="state")
        dropped = codec.dumps(Dropped(anything=_secret(), note=MASK), root="state")
        replaced = codec.dumps(Replaced(anything=_secret(), note=MASK), root="state")
        empty = codec.dumps(Loose(anything=SecretStr(""), note=MASK), root="state")
        back = Loose.model_validate(codec.loads(beside, root="state"))
    assert codec.loads(alone)["anything"] == MASK and codec.loads(alone)["note"] == MASK
    assert back.anything == MASK and back.declared is not None
    assert back.declared.get_secret_value() == SECRET and SECRET not in beside
    assert plain == '{"shown":"**********"}'
    assert codec.loads(revealed) == {"anything": SECRET, "note": MASK}
    assert codec.loads(dropped) == {"note": MASK}
    assert codec.loads(replaced) == {"anything": "seen", "note": MASK}
    assert codec.loads(empty)["anything"] == ""


def test_the_mask_nested_as_deep_as_pydantic_allows_is_followed_without_overflowing() -> None:
    """The search and the following are iterative: a value nested as deep as pydantic
    serialises neither overflows the stack nor is refused for a plain mask at its bottom,
    and a secret there is found."""
    deep: Any = MASK
    lost: Any = _secret()
    for _ in range(250):
        deep, lost = [deep], [lost]
    with codec.sealing(_keys()):
        stored = codec.dumps(Row(value=deep), root="state")
        with pytest.raises(SerialisationError) as caught:
            codec.dumps(Row(value=lost), root="state")
    assert stored.count(MASK) == 1
    assert caught.value.path == "state.value" + "[0]" * 250


def test_a_field_marked_sensitive_seals_an_untyped_secret_whole_and_keeps_it() -> None:
    with codec.sealing(_keys()):
        text = codec.dumps(Marked(whole={"token": _secret()}), root="state")
        back = codec.loads(text, root="state")
    assert MARK in text and SECRET not in text and MASK not in text
    assert back == {"row": None, "whole": {"token": SECRET}}


def test_an_event_still_shows_such_a_secret_masked() -> None:
    """An event leaves the journal for a broker: secrets in it are shown masked (R5.1), so
    the mask there is what is meant, not a loss."""

    @flowx.event("masked.noted", version="1")
    class Noted(BaseModel):
        detail: Any = None

    contract = contract_of(Noted)
    assert contract is not None
    payload = codec.loads(contract.encode(Noted(detail={"token": _secret()})))
    assert payload == {"detail": {"token": MASK}}


class Aliased(BaseModel):
    """One field's name is another's alias: the JSON form stores by alias."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    note: str = Field("", alias="token")
    token: SecretStr | None = Field(None, alias="tok")


class Crossed(BaseModel):
    a: Any = Field(None, alias="b")
    b: Any = Field(None, alias="c")


def test_fields_are_followed_by_the_key_they_are_stored_under_not_their_names() -> None:
    with codec.sealing(_keys()):
        # ``token`` in the JSON form is the field ``note`` (a plain mask), not ``token``.
        stored = codec.dumps(Aliased(token=MASK, tok=_secret()), root="state")
        with pytest.raises(SerialisationError) as first:
            codec.dumps(Crossed(b=_secret(), c=MASK), root="state")
        with pytest.raises(SerialisationError) as second:
            codec.dumps(Crossed(b=MASK, c=_secret()), root="state")
    assert codec.loads(stored)["token"] == MASK and SECRET not in stored
    assert first.value.path == "state.b"  # field ``a``, stored under its alias ``b``
    assert second.value.path == "state.c"


class ComputedOnce(BaseModel):
    calls: ClassVar[list[int]] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shown(self) -> Any:
        self.calls.append(1)
        if len(self.calls) > 1:
            raise RuntimeError("computed twice")
        return MASK


def test_a_computed_field_is_not_run_again_to_follow_a_mask() -> None:
    """A computed field is not state (reading the value back ignores it): a mask there is
    not followed, and its code runs once, as pydantic runs it."""
    ComputedOnce.calls.clear()
    with codec.sealing(_keys()):
        text = codec.dumps(ComputedOnce(), root="state")
    assert codec.loads(text) == {"shown": MASK} and ComputedOnce.calls == [1]


def test_an_empty_secret_key_beside_the_mask_as_a_key_is_stored() -> None:
    """Only a secret pydantic writes as the mask is one lost: an empty one is written ``""``."""
    with codec.sealing(_keys()):
        text = codec.dumps(AnyKeyed(value={MASK: 1, SecretStr(""): 2}), root="state")
    assert codec.loads(text) == {"value": {"": 2, MASK: 1}}


def test_many_masks_under_int_keys_and_in_a_set_are_all_followed() -> None:
    """Masks shown as plain strings, thousands of them under int keys and in a set: each is
    followed back (the containers looked into once), none is a secret, all are stored."""
    many = {i: MASK for i in range(3000)}
    members = {(MASK, i) for i in range(3000)}
    with codec.sealing(_keys()):
        keyed = codec.dumps(IntKeyed(value=many), root="state")
        in_set = codec.dumps(Loose(tags=members), root="state")
        many[1500] = _secret()  # type: ignore[assignment]
        with pytest.raises(SerialisationError) as caught:
            codec.dumps(IntKeyed(value=many), root="state")
    assert keyed.count(MASK) == 3000 and in_set.count(MASK) == 3000
    assert caught.value.path == "state.value['1500']"


class OwnMask(BaseModel):
    user: str
    password: Any = None

    @model_serializer
    def _shown(self) -> dict[str, Any]:
        return {"user": self.user, "password": MASK}


def test_a_serializer_that_writes_the_mask_over_a_secret_is_refused_too() -> None:
    """Stored, the value would read back as the mask: the secret lost all the same. Said in
    the README: write something else there, or leave the secret out of the stored value."""
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(OwnMask(user="ada", password=_secret()), root="state")
    assert caught.value.path == "state.password"


def test_a_secret_in_a_set_of_several_is_named_by_its_place_as_written() -> None:
    """Pydantic writes a set in its iteration order; the path names the secret's place in
    that order, beside a plain mask and other members."""
    secret = _secret()
    value = Loose(tags={"a", "b", MASK, 7, "c", secret})
    written = to_jsonable_python(value)["tags"]
    order = list(value.tags)
    assert written == [MASK if x is secret else x for x in order]  # the order followed
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(value, root="state")
    assert caught.value.path == f"state.tags[{order.index(secret)}]"


class IntKeyed(BaseModel):
    value: dict[int, Any] = {}


class AnyKeyed(BaseModel):
    value: dict[Any, int] = {}


def test_a_signal_payload_sealed_whole_in_a_waits_row_is_refused_too() -> None:
    """A wait's row seals its payload alone (its ``seq`` stays readable): a mask inside the
    payload is followed back into the payload."""
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(
            {"seq": 1, "payload": Row(value={"otp": _secret()})},
            root="result",
            at="/2",
            whole="payload",
        )
    assert caught.value.path == "result.payload.value.otp"


# -- a mask that leads nowhere in the value ------------------------------------------------


class MovedAny(BaseModel):
    """A serialiser of the application's that moves an untyped secret elsewhere."""

    pw: Any = None

    @model_serializer
    def _moved(self) -> dict[str, Any]:
        return {"creds": [self.pw]}


class MovedDeclared(BaseModel):
    """The same with the secret declared: sealed under its own key, kept."""

    pw: SecretStr

    @model_serializer
    def _moved(self) -> dict[str, Any]:
        return {"creds": {"pw": self.pw}}


class MovedText(BaseModel):
    """A serialiser that moves a plain string that happens to be the mask."""

    note: str = ""
    declared: SecretStr | None = None

    @model_serializer
    def _moved(self) -> dict[str, Any]:
        return {"notes": [self.note], "declared": self.declared}


class AliasedKeys(TypedDict):
    token: Annotated[Any, Field(alias="tok")]


class WithAliasedKeys(BaseModel):
    keys: AliasedKeys


OwnKey = Annotated[int, PlainSerializer(lambda k: f"key-{k}")]


class OwnKeyed(BaseModel):
    table: dict[OwnKey, Any] = {}


ASTRAY = [
    ("moved by a model serializer", lambda: MovedAny(pw=_secret()), "state.pw", "state.creds[0]"),
    (
        "a TypedDict key's alias",
        lambda: WithAliasedKeys(keys={"tok": _secret()}),
        "state.keys.token",
        "state.keys.tok",
    ),
    (
        "a dict key's own serializer",
        lambda: OwnKeyed(table={1: _secret()}),
        "state.table[1]",
        "state.table['key-1']",
    ),
    (
        "inside a member sealed whole",
        lambda: Marked(whole=MovedAny(pw=_secret())),
        "state.whole.pw",
        "state.whole.creds[0]",
    ),
]


#: Each case with keys and without, but a member marked ``Sensitive``: without keys that is
#: refused for the keys it lacks before anything is followed.
ASTRAY_KEYED = [
    pytest.param(*case, keys, id=f"{case[0]}-{'with' if keys else 'without'}-keys")
    for case in ASTRAY
    for keys in (True, False)
    if keys or case[0] != "inside a member sealed whole"
]


@pytest.mark.parametrize(("what", "make", "path", "mask", "keys"), ASTRAY_KEYED)
def test_a_mask_that_leads_nowhere_is_refused_when_a_secret_was_not_sealed(
    what: str, make: Any, path: str, mask: str, keys: bool
) -> None:
    """R9.5, R9.8: the mask cannot be followed back to the secret it stands for (a serialiser,
    an alias or a key's serialiser moved it), so where the value holds a secret the sealer did
    not seal, it is refused by the secret's path, saying where the mask was."""
    with codec.sealing(_keys() if keys else None), pytest.raises(SerialisationError) as caught:
        codec.dumps(make(), root="state")
    assert caught.value.path == path, what
    message = str(caught.value)
    assert message.startswith(f"{path} holds a secret the stored form does not keep in its place")
    assert f"'**********' is stored at {mask} instead" in message
    assert "keep a secret where FlowX can seal it" in message and SECRET not in message


def test_a_mask_that_leads_nowhere_beside_only_sealed_secrets_is_stored() -> None:
    """Every secret of the value sealed, a mask that leads nowhere is a string like any other:
    a secret sealed under its own key while a serialiser also moved it, and a plain string
    that is the mask moved beside a sealed secret, are stored, the secret kept."""
    with codec.sealing(_keys()):
        moved = codec.dumps(MovedDeclared(pw=_secret()), root="state")
        text = codec.dumps(MovedText(note=MASK, declared=_secret()), root="state")
        bare = codec.dumps(MovedText(note=MASK), root="state")
        back = MovedDeclared.model_validate(codec.loads(moved, root="state"))
        text_back = codec.loads(text, root="state")
    assert back.pw.get_secret_value() == SECRET and SECRET not in moved
    assert text_back["notes"] == [MASK]
    assert text_back["declared"] == SECRET and SECRET not in text
    assert codec.loads(bare) == {"notes": [MASK], "declared": None}


@pytest.mark.parametrize("whole", [True, "payload"], ids=["sealed-whole", "a-member-sealed-whole"])
def test_sealed_whole_a_mask_that_leads_nowhere_beside_only_sealed_secrets_is_stored(
    whole: bool | str,
) -> None:
    """The same when the row is sealed whole (a result bound for a sealed field, a wait's
    payload): the secrets sealed on the way there are counted, not only the whole's own."""
    with codec.sealing(_keys()):
        for value in (MovedDeclared(pw=_secret()), MovedText(note=MASK, declared=_secret())):
            stored = value if whole is True else {"seq": 1, "payload": value}
            text = codec.dumps(stored, root="result", at="s/1", whole=whole)
            assert MARK in text and SECRET not in text


class SharedSecret(BaseModel):
    """One secret object in two places: sealed in one, moved out of the other's sight."""

    token: SecretStr
    inside: flowx.Sensitive[Any] = None


def test_a_secret_lost_inside_a_member_is_refused_though_the_same_one_is_sealed_beside() -> None:
    secret = _secret()
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(SharedSecret(token=secret, inside=MovedAny(pw=secret)), root="state")
    assert caught.value.path == "state.inside.pw"


class Revealing(BaseModel):
    """A secret its serialiser writes out, beside a computed field that shows one masked."""

    api: Any = None

    @field_serializer("api")
    def _reveal(self, v: Any) -> Any:
        return v.get_secret_value() if isinstance(v, SecretStr) else v

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hint(self) -> SecretStr:
        return SecretStr("shown-as-the-mask")


class HiddenMoved(BaseModel):
    """A private attribute's secret, moved into the stored form by a serialiser."""

    name: str = ""
    _pw: SecretStr = pydantic.PrivateAttr(default_factory=lambda: SecretStr(SECRET))

    @model_serializer
    def _moved(self) -> dict[str, Any]:
        return {"name": self.name, "creds": [self._pw]}


class Sprawling(BaseModel):
    """A mask moved by a serialiser, in a value too large to search for a secret."""

    rows: list[dict[str, int]] = []
    note: str = ""

    @model_serializer
    def _moved(self) -> dict[str, Any]:
        return {"rows": self.rows, "notes": [self.note]}


def test_a_computed_field_mask_is_not_taken_for_a_lost_secret() -> None:
    with codec.sealing(_keys()):
        text = codec.dumps(Revealing(api=_secret()), root="state")
    assert codec.loads(text) == {"api": SECRET, "hint": MASK}


def test_a_private_secret_a_serialiser_moved_is_refused() -> None:
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(HiddenMoved(name="ada"), root="state")
    assert caught.value.path == "state._pw" and SECRET not in str(caught.value)


def test_many_numbers_do_not_hide_a_moved_secret_and_a_value_too_large_is_refused() -> None:
    """Strings and numbers do not count against the search's budget; containers do, and a
    value with more than it can search is refused rather than stored unsearched."""
    numbers = Loose(items=list(range(150_000)), anything=MovedAny(pw=_secret()))
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as lost:
        codec.dumps(numbers, root="state")
    assert lost.value.path == "state.anything.pw"
    sprawling = Sprawling(rows=[{"n": 1} for _ in range(100_001)], note=MASK)
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as large:
        codec.dumps(sprawling, root="state")
    assert large.value.path == "state" and "too large" in str(large.value)
    assert codec.loads(codec.dumps(Sprawling(rows=[{"n": 1}], note=MASK)))["notes"] == [MASK]
