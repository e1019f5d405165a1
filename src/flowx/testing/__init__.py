"""Testing helpers for FlowX users and store authors.

- ``FakeClock``: time that moves when a test says so.
- ``flowx.testing.conformance``: the suites every store must pass, importable so that a
  third-party store runs them unmodified (it needs pytest).
"""

from flowx.testing.clock import FakeClock

__all__ = ["FakeClock"]
