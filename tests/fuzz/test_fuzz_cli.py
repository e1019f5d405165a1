"""Property (issue 12 item 11): whatever ``flowx start`` / ``flowx signal`` are given, they
answer with an exit code and at most a one-line error, never a traceback, and the journal
they write to stays intact. click's CliRunner, on a real SQLite file."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result
from hypothesis import event, given
from hypothesis import strategies as st

from flowx.cli.main import cli
from tests.fuzz.support import FLOWS_REF, FUZZ, FuzzIn, Harness, json_texts, texts, wait


def answered(result: Result) -> None:
    """An exit code from the CLI's table, and no traceback anywhere."""
    assert result.exit_code in (0, 1, 2, 3, 4), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    event(f"exit {result.exit_code}")  # the mix, in --hypothesis-show-statistics


def test_flowx_start_with_any_input(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        db = f"sqlite:///{h.path}"

        @FUZZ
        @given(text=json_texts(), key=st.one_of(st.none(), texts), from_file=st.booleans())
        def start(text: str, key: str | None, from_file: bool) -> None:
            args = ["start", "fuzz.wait", "--db", db, "--flows", FLOWS_REF]
            if from_file:
                path = tmp_path / "input.json"
                path.write_bytes(text.encode("utf-8", "surrogateescape"))
                args += ["--input-file", str(path)]
            else:
                args += ["--input", text]
            if key is not None:
                args += ["--idempotency-key", key]
            answered(CliRunner().invoke(cli, args))

        start()
        h.assert_intact()


def test_flowx_signal_with_any_payload_name_and_key(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        db = f"sqlite:///{h.path}"
        waiting = h.run(h.host.start(wait, FuzzIn(label="w"), run_here=False)).instance_id

        @FUZZ
        @given(
            text=json_texts(),
            name=st.one_of(st.just("go"), texts),
            key=st.one_of(st.none(), texts),
            instance=st.one_of(st.just(waiting), texts),
        )
        def signal(text: str, name: str, key: str | None, instance: str) -> None:
            args = ["signal", instance, name, "--payload", text, "--db", db, "--flows", FLOWS_REF]
            if key is not None:
                args += ["--key", key]
            answered(CliRunner().invoke(cli, args))

        signal()
        h.assert_intact()
