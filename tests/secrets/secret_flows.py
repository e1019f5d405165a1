"""A payment flow that carries secrets through every path the journal has: its input, its
state (a step's result and a signal's payload put there, and a plain result put into a field
marked sensitive), an attempt's error message, and an
emitted event (R9.8, R5.1)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, SecretStr

import flowx

#: The secret every path carries; the canary test greps everything stored for it.
CANARY = "Canary-4929-0000-7731"
#: What the capabilities saw, for the test to check that they got the secrets intact.
SEEN: dict[str, str] = {}
FAILED_ONCE: set[str] = set()

log = logging.getLogger("flowx.tests.payments")


class Billing(BaseModel):
    name: str
    iban: flowx.Sensitive[str]


class Payment(BaseModel):
    order_id: str
    card: SecretStr
    billing: Billing


class Otp(BaseModel):
    code: SecretStr


class PayState(BaseModel):
    token: SecretStr | None = None
    #: Marked below its top level (``... | None``), and filled by a capability that returns a
    #: plain ``str``: only this field says it is sensitive, in the state and in the step's row.
    reference: flowx.Sensitive[str] | None = None
    otp: Otp | None = None
    receipt: str | None = None


@flowx.event("payment.charged", version="1", sensitive={"holder"})
class Charged(BaseModel):
    order_id: str
    card: SecretStr
    billing: Billing
    detail: dict[str, str]
    holder: str


@flowx.capability("pay.tokenise", version="1")
async def tokenise(ctx: flowx.StepContext, p: Payment) -> SecretStr:
    SEEN["card"] = p.card.get_secret_value()
    SEEN["iban"] = p.billing.iban
    return SecretStr(f"tok-{p.card.get_secret_value()}")


@flowx.capability("pay.reference", version="1")
async def reference(ctx: flowx.StepContext, p: Payment) -> str:
    return f"ref-{p.card.get_secret_value()}"


@flowx.capability("pay.charge", version="1")
async def charge(ctx: flowx.StepContext, p: Payment) -> str:
    card = p.card.get_secret_value()
    if p.order_id not in FAILED_ONCE:
        FAILED_ONCE.add(p.order_id)
        # A careless message: the engine stores and logs it with the secret masked.
        raise RuntimeError(f"card {card} declined by the issuer, try again")
    return f"receipt-{p.order_id}"


pay = (
    flowx.flow("pay.card", version="1", input=Payment, state=PayState)
    .step(tokenise, into="token")
    .step(reference, into="reference")
    .await_signal("otp", Otp, into="otp", timeout="1h")
    .step(charge, into="receipt", retry=flowx.Retry(attempts=2, backoff="none"))
    .emit(
        Charged,
        lambda p, s: Charged(
            order_id=p.order_id,
            card=p.card,
            billing=p.billing,
            detail={"holder": p.billing.name, "note": "ok"},
            holder=p.billing.name,
        ),
    )
    .build()
)

#: A sub-flow child gets the card in its input and hands back a token in its state.
tokens = (
    flowx.flow("pay.tokens", version="1", input=Payment, state=PayState)
    .step(tokenise, into="token")
    .build()
)


class ParentState(BaseModel):
    child: PayState | None = None


checkout = (
    flowx.flow("pay.checkout", version="1", input=Payment, state=ParentState)
    .sub_flow(tokens, lambda p, s: p, into="child")
    .build()
)


class Approval(BaseModel):
    note: str  # nothing sensitive in the payload's own type ...


class ApprovalState(BaseModel):
    approval: flowx.Sensitive[Approval] | None = None  # ... only in the field it goes into


approve = (
    flowx.flow("pay.approve", version="1", input=Payment, state=ApprovalState)
    .await_signal("approve", Approval, into="approval", timeout="1h")
    .build()
)


class TwiceState(BaseModel):
    first: flowx.Sensitive[Approval] | None = None
    second: flowx.Sensitive[Approval] | None = None


#: Two waits on one signal name: the second must take the second signal, which a replay knows
#: only from the first wait's row (the ``seq`` it took, kept readable there).
approve_twice = (
    flowx.flow("pay.approve_twice", version="1", input=Payment, state=TwiceState)
    .await_signal("approve", Approval, into="first", timeout="1h", name="first")
    .await_signal("approve", Approval, into="second", timeout="1h", name="second")
    .build()
)


@flowx.capability("pay.part_reference", version="1")
async def part_reference(ctx: flowx.StepContext, part: str) -> str:
    return f"part-{part}-{CANARY}"


class CollectState(BaseModel):
    #: Each element gives back plain values; only the fields the for_eaches collect them
    #: into say they are sensitive — and so every row that journals one must be sealed.
    references: flowx.Sensitive[list[Any]] = []
    approvals: flowx.Sensitive[list[Approval]] = []
    #: No mark: the secret type is the elements' — the body's rows hold plain ``str``s.
    tokens: list[SecretStr] = []


#: What a for_each body gives back reaches the collected list through a fork (each branch's
#: last value), a nested for_each (its body's) and a wait (the signal's payload).
collect = (
    flowx.flow("pay.collect", version="1", input=Payment, state=CollectState)
    .for_each(
        "parts",
        lambda p, s: ["a", "b"],
        lambda body: body.fork(
            "both",
            lambda b: b.step(part_reference, name="left"),
            lambda b: b.for_each(
                "inner", lambda part, s: [part], lambda i: i.step(part_reference, name="right")
            ),
        ),
        into="references",
    )
    .for_each(
        "approvals",
        lambda p, s: ["x"],
        lambda body: body.await_signal("part_ok", Approval, timeout="1h"),
        into="approvals",
    )
    .for_each(
        "tokens",
        lambda p, s: ["t"],
        lambda body: body.step(part_reference, name="token"),
        into="tokens",
    )
    .build()
)

FLOWS = [pay, checkout, approve, approve_twice, collect]
