"""``flowx worker --ingress nats://…`` refuses what it cannot consume with one line naming the
fix — a malformed URL before the node opens, a stream that does not exist once it connects —
never a traceback, never the password (R6.1, R9.8)."""

from __future__ import annotations

import pytest

from tests.cli.runner import invoke as flowx_

FLOWS_REF = "tests.cli.unstorable_flows:FLOWS"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("nats://guest:s3cret@127.0.0.1:4222", "use nats://host:4222/<stream>/<consumer>"),
        ("nats://guest:s3cret@127.0.0.1:4222/S/c?batch=0", "must be a number of at least 1"),
        ("nats://guest:s3cret@127.0.0.1:4222/S/c?filter=a.>.b", "filter 'a.>.b' must be"),
        ("nats://guest:s3cret@127.0.0.1:4222/FXT_no_such_stream/c", "does not exist"),
    ],
    ids=["no-stream", "batch", "filter", "missing-stream"],
)
def test_a_bad_nats_ingress_stops_the_worker_with_one_line(db: str, url: str, says: str) -> None:
    code, _, err = flowx_("worker", "--db", db, "--flows", FLOWS_REF, "--ingress", url)
    assert code == 1
    assert "Traceback" not in err and "s3cret" not in err
    assert says in err.strip().splitlines()[-1]  # one line (after the node's own log lines)
