"""Broker ingress, broker-neutral: what one message from a queue does to a node (R6.1, R9.9).

An adapter (``flowx.ingress.rabbitmq``, ``flowx.ingress.nats_jetstream``) turns each broker
message into a ``Delivery`` and asks ``IngressDispatcher.handle`` for a verdict. It acks only
after ``handle`` returned — the start or signal is then committed to the journal — so a worker
killed before its ack loses nothing: the broker redelivers and the idempotency key makes the
second start return the first instance (R4.1).

The message contract
--------------------
* **A start.** The flow is named by the header ``flowx-flow`` (and, optionally,
  ``flowx-version``), or else by the routing key / subject: its longest ``.``-separated
  suffix that is a flow the node carries (``shop.place_order`` starts ``place_order``,
  ``shop.ing.order`` starts ``ing.order``), else its last segment. The body is the flow's
  input as UTF-8 JSON. A ``flowx-correlation`` header becomes the instance's correlation id,
  which a later signal may name instead of the instance.
* **A signal.** A message with the header ``flowx-signal: <name>`` and
  ``flowx-instance: <instance id>``, or ``flowx-correlation: <correlation id>`` instead (the
  instance header wins when both are given); the body is the signal's payload as UTF-8 JSON.
  A correlation id is resolved by ``flowx.hosting.correlation``: the one instance with it that
  has not ended, else the newest that has ended (so a keyed redelivery is ``duplicate``, an
  unkeyed one ``ingress.instance_finished``); none at all is ``ingress.unknown_instance``,
  several not ended ``ingress.ambiguous_correlation``. A signal with neither header is
  ``ingress.no_instance``.
* **The key.** Both carry an idempotency key: the header ``flowx-idempotency-key`` if given,
  else the broker's message id. A message with neither is dead-lettered (``ingress.no_key``):
  a start without a key would run twice on a redelivery. A signal's key makes its redelivery
  inert (receipt status ``duplicate``).

Verdicts
--------
``Started`` and ``Signalled``: ack. ``Dead``: a poison message — no redelivery can ever succeed
— which the adapter dead-letters (with ``code`` and ``reason``) and then acks. Its codes are
stable: ``ingress.too_large``, ``ingress.not_json``, ``ingress.no_key``, ``ingress.no_instance``,
``ingress.unknown_flow``, ``ingress.input_invalid``, ``ingress.conflict`` (the key already
started an instance with another input), ``ingress.unknown_instance``,
``ingress.unknown_signal``, ``ingress.payload_invalid``, ``ingress.instance_finished``,
``ingress.ambiguous_correlation``.

An Ephemeral flow runs to its end inside ``handle`` and keeps no key: a redelivery runs it
again. Ingress is meant for Durable flows.

Anything else — the journal or the lease store down, the host draining, a store refusing us
a privilege, a bug — raises ``IngressRetry``: the fault is on our side, so the message must
not be dead-lettered. The adapter does not ack it and lets the broker redeliver it later.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from flowx import metrics
from flowx.errors import (
    CorrelationAmbiguous,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    InputInvalid,
    InstanceNotFound,
    RequestInvalid,
    SignalPayloadInvalid,
    SignalUnknown,
)
from flowx.hosting.correlation import resolve_correlation
from flowx.hosting.host import FlowHost
from flowx.redaction import redact
from flowx.stores.errors import InstanceFinished

log = logging.getLogger("flowx.ingress")

__all__ = [
    "FLOW_HEADER",
    "INSTANCE_HEADER",
    "KEY_HEADER",
    "SIGNAL_HEADER",
    "VERSION_HEADER",
    "Dead",
    "Delivery",
    "IngressDispatcher",
    "IngressRetry",
    "Signalled",
    "Started",
    "Verdict",
]

FLOW_HEADER: Final = "flowx-flow"
VERSION_HEADER: Final = "flowx-version"
KEY_HEADER: Final = "flowx-idempotency-key"
SIGNAL_HEADER: Final = "flowx-signal"
INSTANCE_HEADER: Final = "flowx-instance"
CORRELATION_HEADER: Final = "flowx-correlation"
#: Headers a dead letter carries (besides the original message's own).
DEAD_CODE_HEADER: Final = "flowx-dead-code"
DEAD_REASON_HEADER: Final = "flowx-dead-reason"
#: The default bound on a message body: an input larger than this is a mistake, not work.
DEFAULT_MAX_BYTES: Final = 1024 * 1024
#: The longest reason a dead letter carries: one readable line.
REASON_LIMIT: Final = 500


@dataclass(frozen=True)
class Delivery:
    """One broker message, as every adapter hands it over.

    ``headers`` are the message's headers as text (an adapter decodes bytes values);
    ``subject`` is the AMQP routing key or the NATS subject; ``redelivered`` is the broker's
    own flag (informational: correctness rests on the idempotency key, not on it)."""

    body: bytes
    message_id: str | None
    headers: Mapping[str, str] = field(default_factory=dict)
    subject: str = ""
    redelivered: bool = False


@dataclass(frozen=True)
class Started:
    """The message started ``instance_id`` (``created``), or its key had already started it
    (``created=False``: a redelivery, nothing new ran). Ack."""

    instance_id: str
    created: bool


@dataclass(frozen=True)
class Signalled:
    """The signal was delivered; ``status`` is the receipt's (``woken``, ``kept``,
    ``duplicate`` for a redelivery, ``late``). Ack."""

    instance_id: str
    status: str


@dataclass(frozen=True)
class Dead:
    """A poison message: no redelivery can succeed. Dead-letter it with ``code`` and
    ``reason`` (redacted, one line), then ack it so it stops blocking the queue."""

    code: str
    reason: str


Verdict = Started | Signalled | Dead


class IngressRetry(FlowXError):
    """The message could not be handled because of *our* side — the journal or lease store
    unreachable, the host draining, a store refusing a privilege — not because of the message.

    The adapter must not ack it (nor dead-letter it): it lets the broker redeliver it, after
    a backoff. ``__cause__`` is the original error."""

    code = "ingress.retry"
    retryable = True


def _dead(code: str, reason: str) -> Dead:
    """A dead verdict whose reason is one bounded line. The reasons are FlowX's own messages,
    which never quote a secret nor an input's values (R9.8; ``flowx.validation`` leaves the
    values out), so they are not run through ``redact``: it would hide ``a: b@c`` spans such as
    the list of carried flows (``ing.order@1``)."""
    line = " ".join(reason.split())
    return Dead(code, line if len(line) <= REASON_LIMIT else line[: REASON_LIMIT - 1] + "…")


class IngressDispatcher:
    """Turns deliveries into starts and signals on ``host``; one per worker, shared by every
    adapter the worker runs (it keeps no per-message state)."""

    def __init__(self, host: FlowHost, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        self.host = host
        self.max_bytes = max_bytes

    def free_slots(self) -> int:
        """How many more instances the host can run now: an adapter's prefetch bound, so a
        worker with no free slot stops pulling messages (backpressure)."""
        return max(0, self.host.settings.max_concurrent_flows - self.host.in_flight)

    async def handle(self, d: Delivery) -> Verdict:
        """The verdict for ``d``; raises ``IngressRetry`` when our side cannot take it now."""
        try:
            verdict = await self._handle(d)
        except IngressRetry:
            metrics.INGRESS_MESSAGES.inc("retry")
            raise
        if isinstance(verdict, Dead):
            metrics.INGRESS_MESSAGES.inc("dead")
            log.warning(
                "ingress message %s on %r dead-lettered: %s: %s",
                redact(d.message_id or "-"),
                redact(d.subject),
                verdict.code,
                verdict.reason,
                extra={"ingress_code": verdict.code},
            )
        elif isinstance(verdict, Started):
            metrics.INGRESS_MESSAGES.inc("started" if verdict.created else "duplicate")
        else:
            metrics.INGRESS_MESSAGES.inc("signalled")
        return verdict

    async def _handle(self, d: Delivery) -> Verdict:
        if self.host.draining or not self.host.ready:
            raise IngressRetry("the host is draining or not ready; the message is left queued")
        if len(d.body) > self.max_bytes:
            return _dead(
                "ingress.too_large",
                f"the body is {len(d.body)} bytes, over the limit of {self.max_bytes}",
            )
        text = _json_text(d.body)
        if isinstance(text, Dead):
            return text
        key = d.headers.get(KEY_HEADER) or d.message_id
        if not key:
            return _dead(
                "ingress.no_key",
                f"the message has no {KEY_HEADER} header and no message id; without a key a "
                "redelivery would run it twice",
            )
        signal = d.headers.get(SIGNAL_HEADER)
        try:
            if signal is not None:
                return await self._signal(d, signal, text, key)
            return await self._start(d, text, key)
        except IngressRetry:
            raise
        except Exception as exc:
            if not isinstance(exc, FlowXError):  # not an outage: a fault to look at
                log.error("ingress could not handle a message", exc_info=True)
            raise IngressRetry(f"the message could not be handled now: {redact(str(exc))}") from exc

    async def _start(self, d: Delivery, text: str, key: str) -> Verdict:
        flow = d.headers.get(FLOW_HEADER) or self._flow_of(d.subject)
        if not flow:
            return _dead(
                "ingress.unknown_flow",
                f"no {FLOW_HEADER} header and an empty routing key: name the flow to start",
            )
        version = d.headers.get(VERSION_HEADER) or None
        try:
            handle = await self.host.start(
                flow,
                text,
                version=version,
                idempotency_key=key,
                correlation_id=d.headers.get(CORRELATION_HEADER) or None,
            )
        except FlowNotFound as exc:
            named = "" if FLOW_HEADER in d.headers else f"routing key {d.subject!r}: "
            return _dead("ingress.unknown_flow", named + exc.message)
        except IdempotencyConflict as exc:
            return _dead("ingress.conflict", exc.message)
        except InputInvalid as exc:
            return _dead("ingress.input_invalid", exc.message)
        except RequestInvalid as exc:  # an input (or key) the journal cannot store (R9.5)
            return _dead("ingress.input_invalid", exc.message)
        except FlowXError as exc:
            raise _retry(exc) from exc
        return Started(handle.instance_id, handle.created)

    def _flow_of(self, subject: str) -> str:
        """The flow a routing key / subject names: its longest ``.``-separated suffix that is
        a flow this node carries (flow ids hold dots: ``shop.ing.order`` names ``ing.order``),
        else its last segment (which then is reported unknown)."""
        carried = {plan.flow_id for plan in self.host.plans}
        parts = subject.split(".")
        for i in range(len(parts)):
            name = ".".join(parts[i:])
            if name in carried:
                return name
        return parts[-1]

    async def _signal(self, d: Delivery, name: str, text: str, key: str) -> Verdict:
        instance_id = d.headers.get(INSTANCE_HEADER) or await self._resolve(d)
        if isinstance(instance_id, Dead):
            return instance_id
        if not instance_id:
            return _dead(
                "ingress.no_instance",
                f"signal {name!r} has no {INSTANCE_HEADER} header nor {CORRELATION_HEADER}",
            )
        try:
            receipt = await self.host.signal(instance_id, name, text, key=key)
        except InstanceNotFound as exc:
            return _dead("ingress.unknown_instance", exc.message)
        except InstanceFinished as exc:
            return _dead("ingress.instance_finished", exc.message)
        except FlowNotFound as exc:  # this node does not carry the instance's flow version
            return _dead("ingress.unknown_flow", exc.message)
        except SignalUnknown as exc:
            return _dead("ingress.unknown_signal", exc.message)
        except SignalPayloadInvalid as exc:
            return _dead("ingress.payload_invalid", exc.message)
        except RequestInvalid as exc:  # a payload (or key) the journal cannot store (R9.5)
            return _dead("ingress.payload_invalid", exc.message)
        except FlowXError as exc:
            raise _retry(exc) from exc
        return Signalled(instance_id, receipt.status)

    async def _resolve(self, d: Delivery) -> str | Dead | None:
        """The instance ``d``'s ``flowx-correlation`` names (``flowx.hosting.correlation``),
        its dead verdict, or ``None`` when it has no such header."""
        correlation = d.headers.get(CORRELATION_HEADER)
        if not correlation:
            return None
        store = self.host.store
        if store is None:  # our configuration, not the message: never dead-lettered
            raise IngressRetry("this host has no journal to find a correlation id in")
        try:
            return await resolve_correlation(store.catalog, correlation)
        except CorrelationAmbiguous as exc:
            return _dead("ingress.ambiguous_correlation", exc.message)
        except InstanceNotFound as exc:
            return _dead("ingress.unknown_instance", exc.message)
        except FlowXError as exc:
            raise _retry(exc) from exc


def _retry(exc: FlowXError) -> IngressRetry:
    """Our side failed (``exc.code`` says how): the message waits for a redelivery."""
    return IngressRetry(f"{exc.code}: {redact(exc.message)}")


def _json_text(body: bytes) -> str | Dead:
    """The body as JSON text, or the ``ingress.not_json`` verdict. Parsed here once so a
    malformed body gets its own code rather than a model's ``json_invalid`` field error."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _dead("ingress.not_json", f"the body is not UTF-8 (byte {exc.start})")
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        return _dead("ingress.not_json", f"the body is not JSON: {exc}")
    return text


def _refuse_constant(name: str) -> object:
    """``NaN`` and ``Infinity`` are not JSON, whatever Python's parser allows."""
    raise ValueError(f"{name} is not a JSON value")
