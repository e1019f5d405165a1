"""A secret no declared type covers is refused, never stored as pydantic's mask (R9.5, R9.8).

Where a field is typed ``Any``, a ``dict``/``list`` without element types, a ``set``, or is a
model's extra field, the sealer cannot know a ``SecretStr`` may be there, and pydantic's
serialiser writes ``"**********"`` for it: stored, the secret would be lost without a word.
The codec finds it (only when the mask is in the text it encoded) and refuses the value by the
path of the secret. A string that merely is ``"**********"`` is stored as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

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


@dataclasses.dataclass
class Holder:
    value: Any = None


class Marked(BaseModel):
    whole: flowx.Sensitive[Any] = None


def _keys() -> Sealing:
    return Sealing(Keyring.parse(f"k1:{generate_key()}"), "i-1")


CASES = [
    ("an Any field", lambda: Loose(anything=SecretStr(SECRET)), "state.anything"),
    ("a bare dict", lambda: Loose(table={"k": SecretStr(SECRET)}), "state.table.k"),
    ("a bare list", lambda: Loose(items=[1, SecretStr(SECRET)]), "state.items[1]"),
    ("a set", lambda: Loose(tags={SecretStr(SECRET)}), "state.tags[0]"),
    ("an extra field", lambda: Extra(name="x", token=SecretStr(SECRET)), "state.token"),
    ("a dataclass's Any field", lambda: Holder(value=SecretStr(SECRET)), "state.value"),
    (
        "a model in a declared list",
        lambda: Rows(rows=[Row(value=1), Row(value=SecretStr(SECRET))]),
        "state.rows[1].value",
    ),
    (
        "a model in an Any field",
        lambda: Loose(anything=Row(value=SecretStr(SECRET))),
        "state.anything.value",
    ),
    (
        "a model in a dict",
        lambda: {"inner": Loose(anything=SecretStr(SECRET))},
        "state.inner.anything",
    ),
]


@pytest.mark.parametrize("keys", [True, False], ids=["with-keys", "without-keys"])
@pytest.mark.parametrize(("what", "make", "path"), CASES, ids=[c[0] for c in CASES])
def test_a_secret_no_declared_type_covers_is_refused_by_its_path(
    what: str, make: Any, path: str, keys: bool
) -> None:
    with codec.sealing(_keys() if keys else None), pytest.raises(SerialisationError) as caught:
        codec.dumps(make(), root="state")
    assert caught.value.path == path, what
    message = str(caught.value)
    assert message.startswith(f"{path} holds a secret where no declared type says one can be")
    assert "'**********'" in message and "declare the field's type" in message
    assert SECRET not in message


def test_a_generic_secret_is_refused_naming_what_to_declare_instead() -> None:
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(Loose(pin=pydantic.Secret[int](4321)), root="input")
    assert caught.value.path == "input.pin"
    assert "is a pydantic Secret[...], which FlowX cannot seal" in str(caught.value)
    assert "SecretStr or SecretBytes" in str(caught.value)


def test_a_step_result_with_such_a_secret_is_refused_with_the_steps_code() -> None:
    with codec.sealing(_keys()), pytest.raises(SerialisationError) as caught:
        codec.dumps(
            Row(value={"token": SecretStr(SECRET)}),
            root="result",
            code="step.result_unstorable",
            context="step 'login': the result of auth.login@1",
        )
    assert caught.value.code == "step.result_unstorable"
    assert caught.value.path == "result.value.token"
    assert str(caught.value).startswith("step 'login': the result of auth.login@1 cannot be stored")


def test_the_mask_as_a_plain_string_is_stored_as_it_is() -> None:
    """No secret behind it: the walk finds none, so nothing is refused — beside a sealed
    secret, in an Any field, in a plain dict."""
    with codec.sealing(_keys()):
        alone = codec.dumps(Loose(anything=MASK, note=MASK), root="state")
        beside = codec.dumps(Loose(anything=MASK, declared=SecretStr(SECRET)), root="state")
        plain = codec.dumps({"shown": MASK}, root="state")
        back = Loose.model_validate(codec.loads(beside, root="state"))
    assert codec.loads(alone)["anything"] == MASK and codec.loads(alone)["note"] == MASK
    assert back.anything == MASK and back.declared is not None
    assert back.declared.get_secret_value() == SECRET and SECRET not in beside
    assert plain == '{"shown":"**********"}'


def test_a_field_marked_sensitive_seals_an_untyped_secret_whole_and_keeps_it() -> None:
    with codec.sealing(_keys()):
        text = codec.dumps(Marked(whole={"token": SecretStr(SECRET)}), root="state")
        back = codec.loads(text, root="state")
    assert MARK in text and SECRET not in text and MASK not in text
    assert back == {"whole": {"token": SECRET}}


def test_an_event_still_shows_such_a_secret_masked() -> None:
    """An event leaves the journal for a broker: secrets in it are shown masked (R5.1), so
    the mask there is what is meant, not a loss."""

    @flowx.event("masked.noted", version="1")
    class Noted(BaseModel):
        detail: Any = None

    contract = contract_of(Noted)
    assert contract is not None
    payload = codec.loads(contract.encode(Noted(detail={"token": SecretStr(SECRET)})))
    assert payload == {"detail": {"token": MASK}}
