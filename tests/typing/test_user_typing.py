"""A user's ``mypy --strict`` sees FlowX's types (issue 17, item 6: ``py.typed``).

``user_flows.py`` is written as a user writes a flow (README "## A flow"). It is copied into
a directory of its own with a bare ``strict = True`` config, so mypy reads ``flowx`` as an
installed package — found in site-packages and read only because the wheel ships
``py.typed`` — never through this repository's ``[tool.mypy]`` (its ``files=``, its pydantic
plugin). Every ``# revealed:`` must be revealed exactly, every ``# mypy-error:`` line refused
with that code, and nothing else reported: an ``Any`` leaking out of the public API shows up
as a revealed type that no longer matches, or as an expected error that no longer happens.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from mypy import api

USER_MODULE = Path(__file__).with_name("user_flows.py")
CONFIG = "[mypy]\nstrict = True\n"

_REVEALED = re.compile(r"^\s*#\s*revealed:\s*(?P<type>.+?)\s*$")
_CONTINUED = re.compile(r"^\s*#\s{2,}(?P<more>\S.*?)\s*$")
_EXPECTED_ERROR = re.compile(
    r"^\s*[^#\s].*#\s*mypy-error:\s*(?P<code>[a-z-]+)(?::\s*(?P<text>.+?))?\s*$"
)
_REPORTED = re.compile(
    r"^user_flows\.py:(?P<line>\d+): (?P<kind>error|note): (?P<message>.*?)"
    r"(?:  \[(?P<code>[a-z-]+)\])?$"
)


def _normalised(type_text: str) -> str:
    """mypy versions differ in whether they spell ``builtins.str`` or ``str``."""
    return type_text.replace("builtins.", "")


def _marks() -> tuple[dict[int, str], dict[int, tuple[str, str | None]]]:
    """The expected reveals (by the line of their ``reveal_type``) and errors (by line)."""
    revealed: dict[int, str] = {}
    errors: dict[int, tuple[str, str | None]] = {}
    pending: str | None = None
    for number, line in enumerate(USER_MODULE.read_text().splitlines(), start=1):
        if (m := _REVEALED.match(line)) is not None:
            pending = m["type"]
        elif pending is not None and (m := _CONTINUED.match(line)) is not None:
            pending += " " + m["more"]
        elif pending is not None:
            assert line.strip().startswith("reveal_type("), f"line {number}: {line!r}"
            revealed[number] = _normalised(pending)
            pending = None
        elif (m := _EXPECTED_ERROR.search(line)) is not None:
            errors[number] = (m["code"], m["text"])
    return revealed, errors


def _run_mypy(workdir: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[str, int]:
    """mypy as a user's project runs it: its own directory, its own config, its own cache."""
    shutil.copy(USER_MODULE, workdir / USER_MODULE.name)
    (workdir / "mypy.ini").write_text(CONFIG)
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("MYPYPATH", raising=False)
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(workdir / "mypy.ini"),
            "--cache-dir",
            str(workdir / ".mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            *extra,
            USER_MODULE.name,
        ]
    )
    assert not stderr, stderr
    return stdout, status


def test_marks_are_there_to_check() -> None:
    revealed, errors = _marks()
    assert len(revealed) >= 6
    assert len(errors) >= 6


def test_mypy_strict_reveals_the_declared_types_and_refuses_each_misuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    revealed, expected_errors = _marks()
    stdout, status = _run_mypy(tmp_path, monkeypatch)
    seen_reveals: dict[int, str] = {}
    seen_errors: dict[int, list[tuple[str | None, str]]] = {}
    unparsed: list[str] = []
    for line in stdout.splitlines():
        m = _REPORTED.match(line)
        if m is None:
            unparsed.append(line)
            continue
        number = int(m["line"])
        message = m["message"]
        if m["kind"] == "note":
            shown = re.fullmatch(r'Revealed type is "(.*)"', message)
            if shown is not None:
                seen_reveals[number] = _normalised(shown[1])
            continue  # other notes only explain the error on the line before
        seen_errors.setdefault(number, []).append((m["code"], message))

    assert unparsed == [], stdout
    assert seen_reveals == revealed, stdout
    unexpected = {n: e for n, e in seen_errors.items() if n not in expected_errors}
    assert unexpected == {}, stdout
    for number, (code, text) in expected_errors.items():
        reported = seen_errors.get(number, [])
        assert [c for c, _ in reported] == [code], f"line {number}: {reported}\n{stdout}"
        if text is not None:
            assert text in reported[0][1], f"line {number}: {reported}"
    assert status == 1  # errors were found: the misuse lines


def test_mypy_finds_flowx_only_as_an_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without site-packages mypy cannot find ``flowx`` at all, so the test above
    read the installed package (PEP 561: through its ``py.typed``), not a source path."""
    stdout, _ = _run_mypy(tmp_path, monkeypatch, "--no-site-packages")
    assert 'Cannot find implementation or library stub for module named "flowx"' in stdout
