"""Replay planning moved to the engine (``flowx.engine.replay_plan``), next to the saga whose
order it lists; this module keeps the old import path working for the host and the CLI."""

from flowx.engine.replay_plan import ReplayMode, ReplayPlan, plan_replay

__all__ = ["ReplayMode", "ReplayPlan", "plan_replay"]
