"""What the HTTP API reads and answers, as pydantic models: they validate every request body
and are the source of the OpenAPI document (``docs/openapi.json``).

The answers mirror ``flowx.hosting.documents`` (what ``flowx ... -o json`` prints), field for
field, so a script can move between the CLI and the API without learning a second shape.
Request bodies forbid unknown fields: a misspelt ``idempotency_key`` must be an error, not a
start without one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from flowx.stores.records import InstanceState

#: A name, key or filter (``flowx.names``): no control characters or line breaks, at most
#: 200 characters. In the document too, so a client learns the rule before it is refused.
NAME_PATTERN: Final = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$"
NameText = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=NAME_PATTERN)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartRequest(_Request):
    """Start an instance of the flow named in the path."""

    input: Any = Field(default=None, description="The flow's input (its model's fields).")
    version: NameText | None = None
    idempotency_key: NameText | None = Field(
        default=None,
        description="A repeated key returns the instance it started first; nothing is started.",
    )
    correlation_id: NameText | None = None


class SignalRequest(_Request):
    name: NameText
    payload: Any = Field(default=None, description="A value of the type the flow waits for.")
    key: NameText | None = Field(default=None, description="Redelivery with a key is inert.")


class StopRequest(_Request):
    reason: str = Field(min_length=1, max_length=1000, description="Journaled with the stop.")


class ReplayRequest(_Request):
    from_step: NameText | int = Field(description="The step to re-run from: its name or id.")
    deadline: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,4}(ms|s|m|h|d)?$",
        description="A new deadline, a duration from now (90s, 45m, 2h, 7d): a TimedOut "
        "instance needs one.",
    )
    dry_run: bool = False


class Instance(BaseModel):
    instance_id: str
    flow_id: str
    flow_version: str
    state: InstanceState
    fence: int
    next_sequence: int
    input: Any
    state_bag: Any
    state_bag_sequence: int | None
    error: Any
    tenant_id: str | None
    idempotency_key: str | None
    correlation_id: str | None
    deadline_at: datetime | None
    parent_instance_id: str | None
    parent_scope: str | None
    parent_step_id: int | None
    resume_count: int
    codec_version: int
    created_at: datetime
    updated_at: datetime
    wake_at: datetime | None = None
    wake_signal: str | None = None
    replay_sequence: int | None = None
    replay_from: int | None = None
    stop_request: Any = None


class InstancePage(BaseModel):
    instances: list[Instance]
    next: str | None = Field(description="Pass as ?before= for the next page; null at the end.")


class Step(BaseModel):
    instance_id: str
    scope: str
    step_id: int
    attempt: int
    sequence: int
    step_name: str
    outcome: str
    result: Any
    capability_id: str | None
    capability_version: str | None
    nondeterministic: str | None
    duration_ms: int
    committed_at: datetime
    node_id: str | None = None


class Steps(BaseModel):
    steps: list[Step]


class Waiting(BaseModel):
    kind: str
    signal: str | None
    wake_at: datetime | None
    step_id: int | None
    step: str | None
    scope: str | None


class Parent(BaseModel):
    instance_id: str
    scope: str | None
    step_id: int | None


class Signal(BaseModel):
    seq: int
    name: str
    key: str | None
    received_at: datetime
    taken: bool
    payload: Any


class Event(BaseModel):
    event_id: str
    type: str
    partition_key: str | None
    staged_at: datetime | None
    published_at: datetime | None
    dead_at: datetime | None
    attempts: int


class InstanceView(BaseModel):
    """An instance with what it waits for, its parent, its inbox and its events."""

    instance: Instance
    waiting: Waiting | None
    parent: Parent | None
    signals: list[Signal]
    events: list[Event]


class Started(BaseModel):
    instance_id: str
    flow_id: str
    flow_version: str
    created: bool = Field(description="False: the idempotency key had started it before.")
    state: InstanceState | None = Field(
        default=None, description="Set for an Ephemeral flow, which ran within the request."
    )
    result: Any = None
    error: Any = None


class Result(BaseModel):
    instance_id: str
    state: InstanceState
    result: Any
    error: Any


class Receipt(BaseModel):
    instance_id: str
    name: str
    seq: int | None
    status: str
    state: InstanceState


class Stopped(BaseModel):
    instance_id: str
    mode: Literal["cancel", "terminate"]
    status: str
    state: InstanceState
    reached: list[str]
    waiting: list[str]


class Replay(BaseModel):
    instance_id: str
    state: InstanceState
    mode: str
    step: str
    step_id: int
    scope: str
    reruns: list[str]
    undo: list[str]
    kept: list[str]
    deadline_at: datetime | None
    dry_run: bool


class DeadLetter(BaseModel):
    event_id: str
    instance_id: str
    type: str
    schema_version: str
    partition_key: str | None
    staged_seq: int | None
    staged_at: datetime | None
    attempts: int
    dead_at: datetime | None
    reason: str | None
    payload: Any


class Outbox(BaseModel):
    pending: int
    dead_letters: list[DeadLetter]


class Requeued(BaseModel):
    event_id: str
    requeued: bool


class FlowInfo(BaseModel):
    flow_id: str
    version: str
    durable: bool
    input_schema: dict[str, Any]


class Flows(BaseModel):
    flows: list[FlowInfo]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    journal: str = Field(description="up, down, or none (a host without a journal)")
    draining: bool


class FieldError(BaseModel):
    loc: list[str]
    msg: str
    type: str


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable and machine-readable, as the CLI's -o json prints it.")
    message: str
    fields: list[FieldError] = Field(default_factory=list, description="422: each bad field.")


class ErrorBody(BaseModel):
    error: ErrorDetail
