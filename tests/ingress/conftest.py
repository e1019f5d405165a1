"""Fixtures of the ingress tests: a partitioned queue of the test's own on the real RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aiormq import exceptions

from tests.ingress.rabbit import RABBITMQ_URL, Partitioned


@pytest.fixture
async def partitioned() -> AsyncIterator[Partitioned]:
    connection = await aio_pika.connect(RABBITMQ_URL)
    probe = await connection.channel()
    name = f"flowx_t_part_{uuid.uuid4().hex[:10]}"
    try:
        await probe.declare_exchange(f"{name}.probe", "x-consistent-hash", auto_delete=True)
    except exceptions.ConnectionCommandInvalid:
        await connection.close()
        pytest.skip(
            "RabbitMQ's rabbitmq_consistent_hash_exchange plugin is not enabled and could not "
            "be (scripts/services.sh enables it: rabbitmq-plugins enable "
            "rabbitmq_consistent_hash_exchange)"
        )
    await probe.exchange_delete(f"{name}.probe")
    made = Partitioned(await connection.channel(publisher_confirms=True), name, 4)
    try:
        yield made
    finally:
        cleanup = await connection.channel()
        for queue in [f"{name}.p{i}" for i in range(made.n)] + [f"{name}.dead"]:
            await cleanup.queue_delete(queue)
        for exchange in (name, f"{name}.dead"):
            await cleanup.exchange_delete(exchange)
        await connection.close()
