"""FlowX's own query parameters come off a store URL and everything else reaches the driver
byte for byte (issue 17 item 4): decoding and re-encoding the query turned ``%20`` into ``+``,
which libpq reads as a plus, so a ``sslrootcert`` in a folder with a space was not found."""

from __future__ import annotations

import pytest

from flowx.hosting.stores import _take_param
from flowx.urls import own, take_params

TLS = "sslmode=verify-full&sslrootcert=/etc/my%20certs/ca.pem&sslkey=/k+ey.pem&sslcrl=/a%2Bb.crl"


@pytest.mark.parametrize(
    ("url", "driver", "schema"),
    [
        (f"postgresql://u@db/app?{TLS}&flowx_schema=s1", f"postgresql://u@db/app?{TLS}", "s1"),
        (f"postgresql://u@db/app?flowx_schema=s1&{TLS}", f"postgresql://u@db/app?{TLS}", "s1"),
        ("postgresql:///app?host=/run/pg&flowx_schema=s1", "postgresql:///app?host=/run/pg", "s1"),
        ("postgresql://db/app?flowx_schema=a&flowx_schema=b", "postgresql://db/app", "b"),
        (f"postgresql://db/app?{TLS}", f"postgresql://db/app?{TLS}", None),
        ("unix:///tmp/r.sock?db=2&flowx_schema=x#f", "unix:///tmp/r.sock?db=2#f", "x"),
    ],
    ids=["tls-then-own", "own-first", "unix-socket", "last-wins", "none-taken", "fragment"],
)
def test_only_flowx_parameters_are_taken_and_the_rest_is_kept_as_written(
    url: str, driver: str, schema: str | None
) -> None:
    assert _take_param(url, "flowx_schema") == (driver, schema)


def test_every_flowx_parameter_is_taken_off_for_libpq() -> None:
    clean, taken = take_params(f"postgresql://db/app?flowx_schema=s&{TLS}&flowx_x=1", own)
    assert clean == f"postgresql://db/app?{TLS}"
    assert taken == {"flowx_schema": "s", "flowx_x": "1"}
