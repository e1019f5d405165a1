"""Where a setting comes from (issue 15 item 5): arguments > ``FLOWX_*`` environment
variables > ``[tool.flowx]`` in ``./pyproject.toml`` > defaults, for every setting."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

import flowx


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory whose pyproject.toml sets two settings."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.flowx]\nlease_ttl = "1h30m"\ntimer_batch_size = 7\n'
        "recovery = false\n"
    )
    monkeypatch.chdir(tmp_path)
    for name in ("FLOWX_LEASE_TTL", "FLOWX_TIMER_BATCH_SIZE", "FLOWX_RECOVERY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_pyproject_then_environment_then_arguments_win(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_file = flowx.HostSettings.load()
    assert (from_file.lease_ttl, from_file.timer_batch_size, from_file.recovery) == (
        timedelta(hours=1, minutes=30),
        7,
        False,
    )
    assert from_file.timer_poll_interval == timedelta(seconds=1)  # not set anywhere: default
    monkeypatch.setenv("FLOWX_TIMER_BATCH_SIZE", "9")
    assert flowx.HostSettings.load().timer_batch_size == 9
    assert flowx.HostSettings.load(timer_batch_size=11).timer_batch_size == 11
    assert flowx.HostSettings.load(timer_batch_size=None).timer_batch_size == 9


def test_a_bad_value_in_pyproject_names_the_setting_and_where_to_fix_it(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.flowx]\nlease_ttl = "soon"\n')
    with pytest.raises(flowx.SettingsError) as caught:
        flowx.HostSettings.load()
    assert "lease_ttl" in str(caught.value)
    assert "[tool.flowx] in pyproject.toml" in str(caught.value)
    (project / "pyproject.toml").write_text("[tool.flowx]\nno_such_setting = 1\n")
    with pytest.raises(flowx.SettingsError, match="no_such_setting"):
        flowx.HostSettings.load()


def test_resolved_settings_are_plain_values(project: Path) -> None:
    resolved = flowx.HostSettings.load().resolved()
    assert resolved["lease_ttl"] == 5400.0
    assert resolved["lease_renewal_interval"] is None
    assert set(resolved) == set(flowx.HostSettings.model_fields)
