"""A worker process for the NATS kill test (``python -m tests.ingress.nats_worker DB URL N``):
a host on the journal ``DB`` consuming the NATS ingress ``URL``.

After its first ``N`` messages it holds every message it has handled unacked, as a worker
killed between the start's commit and its ack would leave it: the test's SIGKILL then lands
on a batch that is committed in the journal but not acknowledged to the broker.
"""

from __future__ import annotations

import asyncio
import sys

import flowx
from flowx.ingress import Delivery, IngressDispatcher, Verdict
from flowx.ingress.nats_jetstream import NatsJetStreamIngress
from tests.ingress.flows import FLOWS


class Holding(IngressDispatcher):
    """Settles the first ``acked`` messages, then holds each one after handling it."""

    def __init__(self, host: flowx.FlowHost, acked: int) -> None:
        super().__init__(host)
        self.acked = acked

    async def handle(self, d: Delivery) -> Verdict:
        verdict = await super().handle(d)
        self.acked -= 1
        if self.acked < 0:
            await asyncio.Event().wait()  # until the SIGKILL
        return verdict


async def main(db: str, url: str, acked: int) -> None:
    async with flowx.FlowHost(store=flowx.from_url(db), flows=FLOWS) as host:
        await NatsJetStreamIngress(url).start(Holding(host, acked))
        await asyncio.Event().wait()  # until the SIGKILL


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
