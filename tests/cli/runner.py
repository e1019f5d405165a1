"""Run the ``flowx`` command in-process, as the CLI tests do."""

from __future__ import annotations

from click.testing import CliRunner

from flowx.cli.main import cli


def invoke(*args: str) -> tuple[int, str, str]:
    """``flowx ARGS`` through click's runner: the exit code, stdout and stderr, kept apart."""
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr
