"""Plan diagnostic codes (R2.12). Each error is raised at build time with a code and a fix.

The codes are stable: documentation and users' tests may refer to them.
"""

from __future__ import annotations

from typing import Final

CODES: Final[dict[str, str]] = {
    "FLOWX1001": "the flow has no steps",
    "FLOWX1002": "a step's target is not a capability",
    "FLOWX1003": "two nodes share a name",
    "FLOWX1004": "into= names no field of the state model",
    "FLOWX1005": "compensate= is not a capability",
    "FLOWX1006": "the state model cannot be built with no arguments",
    "FLOWX1007": "input= / state= is not a pydantic model class",
    "FLOWX1008": "a retry policy asks to retry a capability declared idempotent=False",
    "FLOWX1009": "a duration is not valid",
    "FLOWX1010": "a for_each or fork branch has an empty body",
    "FLOWX1011": "a for_each into= field is not a list",
    "FLOWX1012": "a sub_flow target is not a built plan",
    "FLOWX1013": "a fork has fewer than two branches",
    "FLOWX1014": "the flow id or version is malformed",
    "FLOWX1015": "into= is used but the flow declares no state model",
    "FLOWX1016": "a selector (argument=, items=, build=, partition_key=) is not callable",
    "FLOWX1017": "a signal or timer in a flow that journals nothing",
    "FLOWX1018": "a step names a capability that is not registered",
    "FLOWX1019": "a wait (await_signal, sleep, sub_flow) inside a fork branch",
    "FLOWX1020": "two fork branches write the same state field",
    "FLOWX1021": "a signal payload type that cannot be validated",
    "FLOWX1022": "a sub_flow whose child (or parent) is not Durable",
    "FLOWX1023": "a signal name that is empty or uses the reserved 'flowx.' prefix",
    "FLOWX1024": "an emit in an Ephemeral flow, or an event with no declared contract",
    "FLOWX1025": "a step timeout (or the flow's step_timeout=) is unparsable, not positive, "
    "or longer than 7 days",
    "FLOWX1026": "a name (flow, step, signal, capability) that is empty, too long or not printable",
    "FLOWX1027": "a retry policy argument out of range (attempts, backoff, multiplier, delays)",
    "FLOWX1028": "a flow with sensitive members (SecretStr, SecretBytes, flowx.Sensitive) "
    "registered on a host with no encryption keys",
}
