"""Where a node reports what an operator must act on: a compensation that ran out (SPEC §8).

The node whose commit moved the instance to ``CompensationFailed`` calls the sink once, after
that commit, and counts it in ``flowx_compensation_failed``. The same alert is staged in the
outbox in that very commit (event type ``flowx.compensation_failed``), so it survives the node
dying before the sink is called and reaches whoever consumes the outbox.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from flowx import codec
from flowx.engine.runner import CompensationAlert

log = logging.getLogger("flowx.alerts")


@runtime_checkable
class AlertSink(Protocol):
    """**Protocol:** told once per instance that ends CompensationFailed."""

    async def compensation_failed(self, alert: CompensationAlert) -> None:
        """Told once when an instance ends CompensationFailed, so an operator learns of it
        (page, ticket) and can fix the fault and ``flowx replay`` it."""
        ...


class LoggingAlertSink:
    """The default sink: one ERROR line under ``flowx.alerts`` with every field as JSON."""

    async def compensation_failed(self, alert: CompensationAlert) -> None:
        log.error(
            "compensation failed: instance %s of %s@%s, step %r (scope %r), %s, %d attempt(s); "
            "fix the fault, then `flowx replay --instance %s --from %s`: %s",
            alert.instance_id,
            alert.flow_id,
            alert.flow_version,
            alert.step,
            alert.scope,
            alert.capability,
            alert.attempts,
            alert.instance_id,
            alert.step,
            codec.dumps(alert.as_dict()),
        )


class RecordingAlertSink:
    """Keeps every alert it is given, for tests."""

    def __init__(self) -> None:
        self.alerts: list[CompensationAlert] = []

    async def compensation_failed(self, alert: CompensationAlert) -> None:
        self.alerts.append(alert)
