"""Flows for ``test_worker_stops``, imported by real ``flowx worker`` processes (``--flows``).

- ``stop.hang``: a sync capability that writes ``started-<instance>`` in ``CRASH_DIR`` and then
  blocks in its thread for as long as the file ``hang`` exists there — a capability stuck in a
  call that never returns, which no drain can wait out.
- ``stop.leak``: a capability that starts a non-daemon thread that never ends, as a careless
  library might; the instance completes, and the thread would keep the interpreter alive.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pydantic import BaseModel

import flowx


class Task(BaseModel):
    name: str


def _dir() -> Path:
    return Path(os.environ["CRASH_DIR"])


@flowx.capability("stop.stuck", version="1.0.0")
def stuck(ctx: flowx.StepContext, task: Task) -> str:
    (_dir() / f"started-{ctx.instance_id}").write_text(str(os.getpid()))
    never = threading.Event()
    while (_dir() / "hang").exists():
        never.wait(0.05)  # a blocking call that does not return while the fault lasts
    return "unstuck"


@flowx.capability("stop.leak", version="1.0.0")
def leak(ctx: flowx.StepContext, task: Task) -> str:
    forever = threading.Event()
    threading.Thread(target=forever.wait, name="leaked-non-daemon", daemon=False).start()
    (_dir() / f"leaked-{ctx.instance_id}").write_text(str(os.getpid()))
    return "leaked"


hang = flowx.flow("stop.hang", version="1", input=Task).step(stuck).build()
leaky = flowx.flow("stop.leak", version="1", input=Task).step(leak).build()

FLOWS = [hang, leaky]
