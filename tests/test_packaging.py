"""The installed distribution (issue 17, item 6): one version, the extras a user can name, the
typing marker.

These read what pip installed (``importlib.metadata``), not pyproject.toml, so they fail when
the build stops reading ``flowx/_version.py`` or publishes an extra it should not.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

import flowx
from flowx.cli.main import cli

DISTRIBUTION = "flowx-runtime"


def test_the_installed_metadata_has_the_version_flowx_reports() -> None:
    assert metadata.version(DISTRIBUTION) == flowx.__version__


def test_flowx_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"], prog_name="flowx")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"flowx, version {flowx.__version__}"


def test_the_extras_are_the_documented_ones_and_no_development_extra() -> None:
    extras = set(metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or [])
    assert extras == {
        "postgres",
        "redis",
        "rabbitmq",
        "nats",
        "otel",
        "prometheus",
        "api",
        "crypto",
        "all",
    }


def test_the_package_is_marked_typed_and_declares_its_licence() -> None:
    assert (Path(flowx.__file__).parent / "py.typed").is_file()
    meta = metadata.metadata(DISTRIBUTION)
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])
