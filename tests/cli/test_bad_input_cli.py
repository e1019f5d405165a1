"""Issue 12 item 11: each bad input the fuzzing found gets one clear line and an exit code,
never a traceback, and writes nothing. In-process (click's CliRunner) on real SQLite files,
PostgreSQL and Redis; the non-UTF-8 argv case also runs a real ``flowx`` process, since only
the OS turns argv bytes into lone surrogates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowx
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord
from tests.cli.runner import invoke as flowx_
from tests.cli.unstorable_flows import FLOWS

FLOWS_REF = "tests.cli.unstorable_flows:FLOWS"
PG = "postgresql://postgres@127.0.0.1:5432/test"
ROOT = Path(__file__).resolve().parents[2]


def start(db: str, *args: str) -> tuple[int, str, str]:
    return flowx_("start", "cli.reading", "--db", db, "--flows", FLOWS_REF, *args)


def instances(db: str) -> list[InstanceRecord]:
    async def main() -> list[InstanceRecord]:
        path = db.removeprefix("sqlite:///")
        async with flowx.FlowHost(
            store=flowx.sqlite(path),
            flows=FLOWS,
            settings=flowx.HostSettings.load(recovery=False),
        ) as h:
            assert h.store is not None
            return list(await h.store.catalog.list_instances(InstanceQuery()))

    return asyncio.run(main())


def one_line_error(err: str, *says: str) -> None:
    """The error is one ``error:`` line saying what is wrong, with no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for part in says:
        assert part in err, err


# -- input -------------------------------------------------------------------------------


def test_a_lone_surrogate_escape_in_input_is_refused_naming_the_field(db: str) -> None:
    code, out, err = start(db, "--input", '{"value": 1, "label": "x\\udfff"}')
    assert (code, out) == (2, "")
    one_line_error(err, "input.label holds a lone surrogate")
    assert instances(db) == []


def test_an_input_file_that_is_not_utf8_is_refused(db: str, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(b'{"value": 1, "label": "caf\xe9"}')
    code, out, err = start(db, "--input-file", str(path))
    assert (code, out) == (2, "")
    one_line_error(err, "--input-file", "is not UTF-8 text: byte 0xe9 at offset 26")
    assert instances(db) == []


def test_an_input_file_with_a_byte_order_mark_is_read(db: str, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(b'\xef\xbb\xbf{"value": 1}')
    code, out, err = start(db, "--input-file", str(path))
    assert code == 0, err
    assert [r.instance_id for r in instances(db)] == [out.strip()]


@pytest.mark.parametrize("option", ["--input", "--input-file"])
def test_json_nested_past_the_parser_is_refused(db: str, tmp_path: Path, option: str) -> None:
    text = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "deep.json"
    path.write_text(text)
    code, out, err = start(db, option, str(path) if option == "--input-file" else text)
    assert (code, out) == (2, "")
    one_line_error(err, option, "nests too deeply")
    assert instances(db) == []


@pytest.mark.parametrize("depth", [201, 400])
def test_json_nested_past_the_validator_is_a_usage_error_too(db: str, depth: int) -> None:
    """Deep enough for pydantic's recursion limit (about 200) but not the parser's: the same
    usage error, not pydantic's "recursion limit exceeded"."""
    text = '{"value": 1, "label": ' + "[" * depth + "]" * depth + "}"
    code, _, err = start(db, "--input", text)
    assert code == 2
    one_line_error(err, "--input", "nests too deeply (more than 200 levels)")
    assert instances(db) == []


def test_json_nested_200_levels_reaches_the_flow(db: str) -> None:
    """199 arrays in an object: 200 levels, which pydantic reads; the field's type decides."""
    text = '{"value": 1, "label": ' + "[" * 199 + "]" * 199 + "}"
    code, _, err = start(db, "--input", text)
    assert code == 1
    one_line_error(err, "input for flow 'cli.reading' is invalid", "field 'label'")


def test_input_that_is_not_json_is_a_usage_error(db: str) -> None:
    code, _, err = start(db, "--input", "{value: 1}")
    assert code == 2
    one_line_error(err, "--input: not valid JSON")


@pytest.mark.parametrize(
    "args",
    [
        ("start", "cli.reading", "--input", '{"value": 1, "label": "\udcff"}'),
        ("start", "cli.reading", "--input", '{"value": 1}', "--idempotency-key", "k-\udcff"),
        ("signal", "i-\udcfe", "reading", "--payload", "{}"),
        ("show", "i-\udcfe"),
        ("list", "--flow", "f\udc80"),
    ],
    ids=["input", "idempotency-key", "signal-instance", "show", "list"],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error(db: str, args: tuple[str, ...]) -> None:
    """What the OS hands Python for argv bytes that are not UTF-8 (PEP 383 surrogates)."""
    extra = ["--flows", FLOWS_REF] if args[0] in ("start", "signal") else []
    code, out, err = flowx_(*args, "--db", db, *extra)
    assert (code, out) == (2, "")
    assert "is not UTF-8: byte 0x" in err and "Traceback" not in err
    assert instances(db) == []


def test_real_argv_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    """The same through a real process: bytes in argv, decoded by Python itself."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "LC_ALL": "C.UTF-8"}
    argv = [
        sys.executable, "-m", "flowx.cli.main", "start", "cli.reading",
        "--db", f"sqlite:///{tmp_path / 'cli.db'}", "--flows", FLOWS_REF,
        "--input", b'{"value": 1, "label": "\xff"}',
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert "is not UTF-8: byte 0xff" in err and "Traceback" not in err
    assert not (tmp_path / "cli.db").exists() or instances(f"sqlite:///{tmp_path / 'cli.db'}") == []


def test_a_signal_payload_too_deep_or_not_json_is_a_usage_error(db: str) -> None:
    for payload, says in (("[" * 100_000, "nests too deeply"), ("{", "not valid JSON")):
        code, _, err = flowx_(
            "signal", "i-1", "reading", "--payload", payload, "--db", db, "--flows", FLOWS_REF
        )
        assert code == 2
        one_line_error(err, "--payload", says)


# -- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("99999999999d", "longer than the longest duration FlowX accepts (36500 days)"),
        ("36501d", "longer than the longest duration"),
        ("nan", "is not a duration"),
        ("1e400s", "is not a duration"),
    ],
)
def test_a_duration_out_of_range_names_the_setting(db: str, value: str, says: str) -> None:
    code, _, err = flowx_("worker", "--db", db, "--flows", FLOWS_REF, "--lease-ttl", value)
    assert code == 1
    one_line_error(err, "lease_ttl", says)


# -- store, lease and publisher URLs -----------------------------------------------------------


def test_a_sqlite_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    code, _, err = start(f"sqlite:///{tmp_path}")
    assert code == 1
    one_line_error(err, "is a directory; name a file in it")


def test_a_sqlite_path_in_a_folder_no_one_may_write_is_refused() -> None:
    code, _, err = start("sqlite:////proc/flowx-test.db")
    assert code == 1
    one_line_error(err, "/proc/flowx-test.db")


def test_a_sqlite_path_whose_folder_is_missing_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "flowx.db"
    code, _, err = start(f"sqlite:///{missing}", "--input", '{"value": 1}')
    assert code == 1
    one_line_error(err, "has not been reachable", "does not exist; create it first")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://flowx:s3cret@[::1", "cannot be parsed: an IPv6 address is not closed"),
        ("postgresql://flowx:s3cret@host:port/db", "cannot be parsed"),
        (PG + "?flowx_schema=Bad-Name&password=s3cret", "schema name 'Bad-Name'"),
        (PG + "?flowx_schema=" + "a" * 64, "at most 63 characters"),
        ("mysql://root:s3cret@localhost/db", "unknown store URL"),
    ],
    ids=["ipv6", "port", "schema", "schema-length", "scheme"],
)
def test_a_bad_store_url_is_one_line_without_its_secret(url: str, says: str) -> None:
    code, _, err = start(url)
    assert code == 1
    one_line_error(err, says)
    assert "s3cret" not in err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:s3cret@127.0.0.1:6379/99999", "DB index is out of range"),
        ("redis://:s3cret@127.0.0.1:6379/abc", "database index 'abc' is not a number"),
        ("redis://127.0.0.1:6379/-1", "database index '-1' is not a number"),
        ("memcached://127.0.0.1:11211", "unknown lease store URL"),
    ],
    ids=["out-of-range", "not-a-number", "negative", "scheme"],
)
def test_a_bad_lease_store_url_is_one_line_without_its_secret(db: str, url: str, says: str) -> None:
    code, _, err = start(db, "--leases", url, "--input", '{"value": 1}')
    assert code == 1
    one_line_error(err, says)
    assert "s3cret" not in err
    assert instances(db) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:s3cret@[::1", "cannot be parsed"),
        ("redis://127.0.0.1:6379/x", "database index 'x'"),
        ("redis://:s3cret@127.0.0.1:6379/99999", "DB index is out of range"),
        ("kafka://127.0.0.1:9092", "cannot publish to"),
        (",", "cannot publish to"),
    ],
    ids=["ipv6", "redis-db", "redis-db-range", "scheme", "empty"],
)
def test_a_bad_publisher_url_stops_the_worker_with_one_line(db: str, url: str, says: str) -> None:
    code, _, err = flowx_("worker", "--db", db, "--flows", FLOWS_REF, "--publish", url)
    assert code == 1
    assert "Traceback" not in err and says in err and "s3cret" not in err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:s3cret@127.0.0.1:5672/", "names no queue"),
        ("amqp://guest:s3cret@[::1", "cannot be parsed"),
        ("kafka://guest:s3cret@127.0.0.1:9092", "cannot consume from"),
        ("amqp://guest:s3cret@127.0.0.1:5672/?queue=q&prefetch=-1", "from 1 to 65535"),
    ],
    ids=["no-queue", "ipv6", "scheme", "prefetch"],
)
def test_a_bad_ingress_url_stops_the_worker_with_one_line(db: str, url: str, says: str) -> None:
    code, _, err = flowx_("worker", "--db", db, "--flows", FLOWS_REF, "--ingress", url)
    assert code == 1
    assert "Traceback" not in err and says in err and "s3cret" not in err
    assert len(err.strip().splitlines()) == 1


# -- other arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        # A bad --flows is a usage error (exit 2), as every malformed argument is.
        (("start", "x", "--flows", "os:path"), 2, "is a module, not a plan"),
        (("start", "x", "--flows", "tests.cli.unstorable_flows:Reading"), 2, "is the class"),
        (("start", "x", "--flows", "..:x"), 2, "must be module:attribute"),
        (("list", "--tenant", "a\x00b"), 2, "names may not hold control characters"),
        (("count", "--version", "1\n2"), 2, "names may not hold control characters"),
        (
            ("retention", "set", "--flow", "a\x00b", "--class", "Completed", "--keep", "1d"),
            2,
            "names may not hold control characters",
        ),
        (("list", "--before", "0001-01-01T00:00:00+14:00,x"), 2, "outside the dates"),
        (("list", "--before", "9999-12-31T23:59:59-14:00,x"), 2, "outside the dates"),
        (("replay", "--instance", "x", "--from", "\u00b2", "--flows", FLOWS_REF), 3, "no flow"),
        (
            ("worker", "--flows", FLOWS_REF, "--ready-file", "/proc/flowx-ready"),
            1,
            "cannot write --ready-file '/proc/flowx-ready'",
        ),
        (
            ("worker", "--flows", FLOWS_REF, "--node-id", "a\nINFO forged"),
            1,
            "node_id 'a\\nINFO forged' holds '\\n'",
        ),
    ],
    ids=["flows-module", "flows-class", "flows-relative", "tenant-nul", "version-newline",
         "retention-flow-nul", "before-min", "before-max",
         "replay-superscript", "ready-file", "node-id"],
)  # fmt: skip
def test_other_bad_arguments_are_one_line(
    db: str, args: tuple[str, ...], code: int, says: str
) -> None:
    exit_code, _, err = flowx_(*args, "--db", db)
    assert exit_code == code, err
    assert "Traceback" not in err and says in err
