"""Sensitive members through the codec (R9.8): sealed at rest with AES-GCM, opened for the
flow's own code, bound to their instance and field, readable across a key rotation, and
masked wherever they are only shown."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pydantic
import pytest
from pydantic import BaseModel, Field, SecretBytes, SecretStr
from typing_extensions import TypedDict

import flowx
from flowx import codec, sealing
from flowx.errors import SerialisationError
from flowx.sealing import MARK, MASK, Keyring, KeysError, Sealing, generate_key

CARD = "4111111111111111"


class Billing(BaseModel):
    name: str
    iban: flowx.Sensitive[str]


class Card(BaseModel):
    pan: SecretStr
    pin: SecretBytes | None = None


class Payment(BaseModel):
    order_id: str
    card: Card
    spares: list[Card] = []
    billing: Billing
    api_key: SecretStr = Field(alias="apiKey")
    audit: int = Field(default=0, exclude=True)


def _payment() -> Payment:
    return Payment(
        order_id="o-1",
        card=Card(pan=CARD, pin=b"\x00\xff12"),
        spares=[Card(pan="5500000000000004")],
        billing=Billing(name="Ada", iban="DE89370400440532013000"),
        apiKey="key-0123456789",
        audit=7,
    )


def _keys(*ids: str) -> Keyring:
    return Keyring.parse(",".join(f"{i}:{generate_key()}" for i in ids))


def test_every_sensitive_member_is_sealed_and_opens_back_whole() -> None:
    keys = _keys("k1")
    with codec.sealing(Sealing(keys, "i-1")):
        text = codec.dumps(_payment(), root="input")
        back = Payment.model_validate(codec.loads(text, root="input"))
    for secret in (CARD, "5500000000000004", "DE89370400440532013000", "key-0123456789"):
        assert secret not in text
    assert text.count(MARK) == 5  # pan, pin, the spare's pan, iban, api key
    assert back.card.pan.get_secret_value() == CARD
    assert back.card.pin is not None and back.card.pin.get_secret_value() == b"\x00\xff12"
    assert back.spares[0].pan.get_secret_value() == "5500000000000004"
    assert back.billing.iban == "DE89370400440532013000"
    assert back.api_key.get_secret_value() == "key-0123456789"
    assert back.audit == 7  # exclude=True is kept by the journal, not dropped
    assert back.order_id == "o-1" and back.billing.name == "Ada"


def test_a_value_without_sensitive_members_is_stored_exactly_as_before() -> None:
    class Plain(BaseModel):
        a: int
        b: list[str]

    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        assert codec.dumps(Plain(a=1, b=["x"]), root="input") == '{"a":1,"b":["x"]}'


def test_a_sealed_member_does_not_open_in_another_instance_or_field() -> None:
    keys = _keys("k1")
    with codec.sealing(Sealing(keys, "i-1")):
        text = codec.dumps(_payment(), root="input")
        stored = json.loads(text)
        with pytest.raises(KeysError, match="moved from another instance or field"):
            codec.loads(text, root="state")  # another place of the same instance
        stored["billing"]["iban"], stored["apiKey"] = stored["apiKey"], stored["billing"]["iban"]
        with pytest.raises(KeysError, match="altered, or moved"):
            codec.loads(json.dumps(stored), root="input")  # swapped between two fields
    with (
        codec.sealing(Sealing(keys, "i-2")),
        pytest.raises(KeysError, match="altered, or moved"),
    ):
        codec.loads(text, root="input")  # copied to another instance


def test_a_step_result_is_bound_to_its_step() -> None:
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(Card(pan=CARD), root="result", at="/3")
        assert codec.loads(text, root="result", at="/3")["pan"] == CARD
        with pytest.raises(KeysError):
            codec.loads(text, root="result", at="/4")


def test_an_int_result_bound_for_a_sealed_field_is_sealed_not_written_as_it_is() -> None:
    """A plain ``int`` skips the codec's scan (issue 14), but not when it is sealed whole: a
    step's result bound for a sensitive state field is sealed, or refused without keys."""
    with pytest.raises(SerialisationError) as refused:
        codec.dumps(4242, root="result", at="/1", whole=True)
    assert refused.value.code == "keys.missing"
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(4242, root="result", at="/1", whole=True)
        assert MARK in text and "4242" not in text
        assert codec.loads(text, root="result", at="/1") == 4242


def test_rotation_new_writes_take_the_first_key_and_old_rows_stay_readable() -> None:
    old = _keys("k1")
    with codec.sealing(Sealing(old, "i-1")):
        written_before = codec.dumps(_payment(), root="input")
    rotated = Keyring(keys={"k2": _keys("k2").keys["k2"], **old.keys}, current="k2")
    with codec.sealing(Sealing(rotated, "i-1")):
        written_after = codec.dumps(_payment(), root="input")
        assert Payment.model_validate(codec.loads(written_before, root="input")).card.pan
        assert Payment.model_validate(codec.loads(written_after, root="input")).card.pan
    assert '"k":"k1"' in written_before and '"k":"k1"' not in written_after
    assert '"k":"k2"' in written_after
    retired = Keyring(keys={"k2": rotated.keys["k2"]}, current="k2")
    with (
        codec.sealing(Sealing(retired, "i-1")),
        pytest.raises(KeysError, match="key 'k1', which is not configured"),
    ):
        codec.loads(written_before, root="input")


def test_without_keys_a_sensitive_member_is_refused_never_stored_masked_or_clear() -> None:
    with pytest.raises(SerialisationError, match=r"input\.apiKey is sensitive") as refused:
        codec.dumps(_payment(), root="input")
    assert refused.value.code == "keys.missing"
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(_payment(), root="input")
    with pytest.raises(SerialisationError, match="no encryption keys") as unread:
        codec.loads(text, root="input")
    assert unread.value.code == "keys.missing"


class Contacts(BaseModel):
    """The mark below a member's top level: in an optional, a list and a dict."""

    primary: flowx.Sensitive[str] | None = None
    spares: list[flowx.Sensitive[str]] = []
    pins: dict[str, flowx.Sensitive[int]] = {}
    absent: flowx.Sensitive[str] | None = None
    nickname: str = ""


def _contacts() -> Contacts:
    return Contacts(
        primary="ada@example.org",
        spares=["bob@example.org", "eve@example.org"],
        pins={"door": 4711},
        nickname="A",
    )


def test_a_mark_inside_an_optional_a_list_or_a_dict_seals_the_whole_member() -> None:
    """``Sensitive[str] | None`` and ``list[Sensitive[str]]`` were once stored in the clear:
    the mark is in the type, and the walk over the value never met it."""
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(_contacts(), root="state")
        back = Contacts.model_validate(codec.loads(text, root="state"))
        # every string of a member sealed whole is scrubbed from messages, not just the whole
        assert codec.scrub("mail to eve@example.org bounced") == f"mail to {MASK} bounced"
    for secret in ("ada@example.org", "bob@example.org", "eve@example.org", "4711"):
        assert secret not in text
    stored = json.loads(text)
    assert {k for k, v in stored.items() if isinstance(v, dict) and MARK in v} == {
        "primary",
        "spares",
        "pins",
    }
    assert stored["absent"] is None and stored["nickname"] == "A"  # nothing to seal
    assert back == _contacts()
    shown = {"primary": MASK, "spares": MASK, "pins": MASK, "absent": None, "nickname": "A"}
    assert sealing.masked(codec.loads(text)) == shown
    plain = _contacts().model_dump(mode="json")
    redacted = {**shown, "primary": "[r]", "spares": "[r]", "pins": "[r]"}
    assert sealing.redacted(_contacts(), plain, "[r]") == redacted


def test_without_keys_a_mark_inside_an_optional_or_a_list_is_refused_too() -> None:
    """As any sensitive member: never stored in the clear for want of keys."""
    with pytest.raises(SerialisationError, match=r"state\.primary is sensitive") as refused:
        codec.dumps(Contacts(primary="ada@example.org", spares=[], pins={}), root="state")
    assert refused.value.code == "keys.missing"
    with pytest.raises(SerialisationError, match=r"state\.spares is sensitive"):
        codec.dumps(Contacts(spares=["bob@example.org"], pins={}), root="state")


@dataclasses.dataclass
class PinSlip:
    pin: flowx.Sensitive[str]


class PinDict(TypedDict):
    pin: flowx.Sensitive[str]


class Slips(BaseModel):
    slip: PinSlip
    entry: PinDict


def test_a_mark_inside_a_dataclass_or_a_typeddict_seals_the_member_whole() -> None:
    """Pydantic validates both, and the walk over a value does not enter them: the mark is
    found in their field types, and the member is sealed whole."""
    value = Slips(slip=PinSlip(pin="pin-7391"), entry={"pin": "pin-8642"})
    assert sealing.declares_sensitive(Slips)  # so a host without keys refuses the flow
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(value, root="state")
        back = Slips.model_validate(codec.loads(text, root="state"))
    assert "pin-7391" not in text and "pin-8642" not in text and text.count(MARK) == 2
    assert back == value


@dataclasses.dataclass
class PanSlip:
    number: SecretStr
    note: str = ""


@dataclasses.dataclass
class CardSlip:
    number: SecretStr
    pin: flowx.Sensitive[str] | None = None
    note: str = ""


class Drawer(BaseModel):
    slip: PanSlip  # no mark in its type: not sealed whole, its secret sealed where it is
    slips: list[PanSlip] = []


def test_a_secret_inside_a_dataclass_is_sealed_not_stored_as_the_mask() -> None:
    """Pydantic's form of a dataclass holds ``"**********"`` for its ``SecretStr``: the value
    was lost. The sealer walks a dataclass's fields as a model's: in a model, in a list, and
    as a value of its own (a step's result), where a field marked ``Sensitive`` is sealed."""
    drawer = Drawer(
        slip=PanSlip(number=SecretStr(CARD), note="kept readable"),
        slips=[PanSlip(number=SecretStr("5500000000000004"))],
    )
    slip = CardSlip(number=SecretStr(CARD), pin="pin-2207", note="kept readable")
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(drawer, root="state")
        back = Drawer.model_validate(codec.loads(text, root="state"))
        result = codec.dumps(slip, root="result", at="/1")
        opened = codec.loads(result, root="result", at="/1")
    for secret in (CARD, "5500000000000004", "pin-2207", MASK):
        assert secret not in text and secret not in result, secret
    assert "kept readable" in text and text.count(MARK) == 2
    assert "kept readable" in result and result.count(MARK) == 2
    assert back.slip.number.get_secret_value() == CARD
    assert back.slips[0].number.get_secret_value() == "5500000000000004"
    assert opened == {"number": CARD, "pin": "pin-2207", "note": "kept readable"}
    with pytest.raises(SerialisationError, match=r"result\.number is sensitive"):
        codec.dumps(slip, root="result", at="/1")  # without keys: refused, not masked


class Base:
    token: SecretStr  # an annotation of a base class, not a field


@dataclasses.dataclass
class WithClassVar(Base):
    number: SecretStr
    default: ClassVar[SecretStr] = SecretStr("not-a-field")


@pydantic.dataclasses.dataclass
class Aliased:
    number: SecretStr = Field(serialization_alias="num")


def test_a_dataclass_walk_keeps_to_its_fields_their_stored_keys_and_unresolved_types() -> None:
    """Class variables and a base class's annotations are not fields; a pydantic dataclass
    stores a field under its alias; a field type that cannot be resolved (a class local to a
    function) is walked by its value. Each secret is sealed, none stored as the mask."""

    class Local(BaseModel):
        number: SecretStr

    @dataclasses.dataclass
    class Holder:
        inner: Local  # resolved from within the function only: get_type_hints fails

    values = (
        WithClassVar(number=SecretStr(CARD)),
        Aliased(number=SecretStr(CARD)),
        Holder(inner=Local(number=SecretStr(CARD))),
    )
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        for value in values:
            text = codec.dumps(value, root="result", at="/1")
            assert CARD not in text and MASK not in text and text.count(MARK) == 1, text
            assert CARD in json.dumps(codec.loads(text, root="result", at="/1")), text
        assert '"num"' in codec.dumps(values[1], root="result", at="/1")


class Wallet(BaseModel):
    card: flowx.Sensitive[Card]  # sealed whole, and the card's own secret inside it


def test_a_member_sealed_whole_keeps_the_secrets_inside_it() -> None:
    """Pydantic's JSON form of a ``SecretStr`` is ``"**********"``: a member sealed whole is
    sealed from FlowX's own form instead, so the card number inside it comes back."""
    wallet = Wallet(card=Card(pan=CARD, pin=b"\x01\x02"))
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(wallet, root="state")
        back = Wallet.model_validate(codec.loads(text, root="state"))
        result = codec.dumps(wallet.card, root="result", at="/1", whole=True)
        card = Card.model_validate(codec.loads(result, root="result", at="/1"))
    assert CARD not in text and CARD not in result and text.count(MARK) == 1
    assert back.card.pan.get_secret_value() == CARD
    assert back.card.pin is not None and back.card.pin.get_secret_value() == b"\x01\x02"
    assert card.pan.get_secret_value() == CARD
    assert json.loads(result)[MARK] and sealing.masked(json.loads(result)) == MASK


def test_a_result_sealed_whole_is_refused_without_keys_and_bound_to_its_step() -> None:
    with pytest.raises(SerialisationError, match="result is sensitive") as refused:
        codec.dumps("DE89370400440532013000", root="result", at="/1", whole=True)
    assert refused.value.code == "keys.missing"
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps("DE89370400440532013000", root="result", at="/1", whole=True)
        assert codec.loads(text, root="result", at="/1") == "DE89370400440532013000"
        with pytest.raises(KeysError, match="altered, or moved"):
            codec.loads(text, root="result", at="/2")  # another step's row
        # a secret sealed on its own already is not sealed a second time
        once = codec.dumps(SecretStr(CARD), root="result", at="/1", whole=True)
        assert once.count(MARK) == 1 and json.loads(once)["t"] == "s"
        assert codec.loads(once, root="result", at="/1") == CARD
    assert "DE89" not in text


def test_displays_show_sealed_members_masked() -> None:
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        text = codec.dumps(_payment(), root="input")
    shown = sealing.masked(codec.loads(text))
    assert shown["card"] == {"pan": MASK, "pin": MASK}
    assert shown["billing"] == {"name": "Ada", "iban": MASK}
    assert shown["apiKey"] == MASK


def test_an_error_message_quoting_a_secret_of_the_instance_is_scrubbed() -> None:
    with codec.sealing(Sealing(_keys("k1"), "i-1")):
        codec.dumps(_payment(), root="input")
        assert codec.scrub(f"card {CARD} declined") == f"card {MASK} declined"
    assert codec.scrub(f"card {CARD} declined") == f"card {CARD} declined"  # no instance


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("k1", "id:base64key"),
        ("k1:bm90IDMyIGJ5dGVz", "not 32 bytes"),
        (f"k1:{generate_key()},k1:{generate_key()}", "given twice"),
        (" , ", "no encryption key"),
    ],
)
def test_a_malformed_key_is_refused_naming_it_never_echoing_it(text: str, problem: str) -> None:
    with pytest.raises(KeysError, match=problem) as refused:
        Keyring.parse(text)
    key = text.partition(":")[2].partition(",")[0]
    assert not key or key not in str(refused.value)


def test_settings_take_the_keys_and_refuse_a_bad_one_at_start_up() -> None:
    settings = flowx.HostSettings.load(encryption_keys=f"new:{generate_key()},old:{generate_key()}")
    assert settings.keyring is not None and settings.keyring.current == "new"
    with pytest.raises(flowx.SettingsError, match="not 32 bytes"):
        flowx.HostSettings.load(encryption_keys="k1:c2hvcnQ=")


@pytest.mark.parametrize(
    ("value", "whole", "says"),
    [
        (float("nan"), True, "result is nan"),
        ("a\ud800b", True, "result holds a lone surrogate"),
        (Contacts(primary="a\ud800b", spares=[], pins={}), False, "result.primary holds a lone"),
    ],
    ids=["nan sealed whole", "surrogate sealed whole", "surrogate in a member sealed whole"],
)
def test_what_cannot_be_stored_is_refused_by_name_even_when_sealed(
    value: object, whole: bool, says: str
) -> None:
    """R9.5: sealing encodes a value before the codec's own checks would see it; what JSON or
    UTF-8 cannot hold is still refused cleanly, naming the field, never as an encoder error."""
    with (
        codec.sealing(Sealing(_keys("k1"), "i-1")),
        pytest.raises(SerialisationError, match=says) as refused,
    ):
        codec.dumps(value, root="result", at="/1", whole=whole, code="step.result_unstorable",
                    context="step 'x'")  # fmt: skip
    assert refused.value.code == "step.result_unstorable"
