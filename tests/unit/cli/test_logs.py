"""One logging setup for `tessera` and `tessera-agent`: the same flags, valid JSON, quiet by default, and a
usage line (never a traceback) for a bad flag."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tessera import logs
from tessera.cli import build_parser as tessera_parser
from tessera.cli import main
from tessera_agent.cli import build_parser as agent_parser
from tessera_agent.cli import main as agent_main

ROOT = Path(__file__).parents[3]
APP = ROOT / "examples" / "app.yaml"
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


NASTY = 'he said "stop" \\ then left\n{"msg": "not a field"}\ttab é'


def test_a_message_with_quotes_is_one_valid_json_object() -> None:
    out = io.StringIO()
    logs.setup("info", "json", out)
    logging.getLogger("tessera.test").warning(NASTY, extra={"app": 'a"1'})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["msg"] == NASTY and record["app"] == 'a"1'
    assert record["level"] == "WARNING" and record["logger"] == "tessera.test" and record["ts"]


def test_an_exception_is_logged_inside_the_json_object() -> None:
    out = io.StringIO()
    logs.setup("error", "json", out)
    try:
        raise RuntimeError('boom "quoted"')
    except RuntimeError:
        logging.getLogger("t").exception("failed")
    record = json.loads(out.getvalue())
    assert 'RuntimeError: boom "quoted"' in record["exc_info"]


def test_text_format_and_level_filtering() -> None:
    out = io.StringIO()
    logs.setup("WARNING", "text", out)
    logging.getLogger("t").info("hidden")
    logging.getLogger("t").warning("shown")
    assert "hidden" not in out.getvalue()
    assert out.getvalue().rstrip().endswith("WARNING t: shown")


def test_setup_twice_does_not_double_lines() -> None:
    out = io.StringIO()
    logs.setup("info", "json", out)
    logs.setup("info", "json", out)
    logging.getLogger("t").info("once")
    assert len(out.getvalue().splitlines()) == 1


def test_setup_refuses_unknown_values() -> None:
    with pytest.raises(ValueError, match="log level"):
        logs.setup("loud")
    with pytest.raises(ValueError, match="log format"):
        logs.setup("info", "xml")


def test_the_tessera_cli_logs_json_through_the_shared_setup(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "info", "--log-format", "json", "validate", str(APP)]) == 0
    capsys.readouterr()
    logging.getLogger("tessera.test").info(NASTY)
    assert json.loads(capsys.readouterr().err)["msg"] == NASTY


def test_quiet_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(APP)]) == 0
    logging.getLogger("tessera.test").info("chatter")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("parser", [tessera_parser, agent_parser])
def test_every_cli_has_the_same_log_flags(parser: object) -> None:
    p = parser()  # type: ignore[operator]
    opts = {a.dest: a for a in p._actions}
    assert tuple(opts["log_level"].choices) == logs.LEVELS
    assert tuple(opts["log_format"].choices) == logs.FORMATS
    assert opts["log_level"].default == "WARNING" and opts["log_format"].default == "json"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--log-level", "bogus"], "argument --log-level: invalid choice: 'BOGUS'"),
        (["--log-format", "xml"], "argument --log-format: invalid choice: 'xml'"),
    ],
)
def test_the_agent_refuses_a_bad_log_flag_with_a_usage_line(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        agent_main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_a_bad_log_format_is_a_usage_error_for_tessera(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--log-format", "xml", "validate", str(APP)])
    assert exit_.value.code == 2
    assert "argument --log-format: invalid choice: 'xml'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["tessera", "tessera-agent"])
def test_a_bad_flag_from_the_shell_is_no_traceback(command: str) -> None:
    proc = subprocess.run(
        [str(BIN / command), "--log-level", "bogus"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "usage:" in proc.stderr


def test_kopf_object_log_lines_are_json_with_the_object_reference() -> None:
    """kopf's per-object loggers attach their settings to each record; the line keeps only `k8s_ref`."""
    from kopf._cogs.configs.configuration import OperatorSettings
    from kopf._core.actions.loggers import LocalObjectLogger

    out = io.StringIO()
    logs.setup("info", "json", out)
    body = {"apiVersion": "tessera.io/v1alpha1", "kind": "App", "metadata": {"name": "a", "namespace": "n"}}
    LocalObjectLogger(body=body, settings=OperatorSettings()).info('Handler "x" succeeded.')
    record = json.loads(out.getvalue())
    assert record["msg"] == 'Handler "x" succeeded.' and record["logger"] == "kopf.objects"
    assert record["k8s_ref"]["name"] == "a" and "settings" not in record


def test_an_extra_that_json_cannot_hold_is_written_as_text() -> None:
    out = io.StringIO()
    logs.setup("info", "json", out)
    logging.getLogger("t").info("odd", extra={"path": Path("/x"), "ids": frozenset({"a"})})
    record = json.loads(out.getvalue())
    assert record["path"] == "/x" and record["ids"] == "frozenset({'a'})"


def test_lines_go_to_stderr_as_it_is_when_written_not_when_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stderr of setup time went away (pytest closes each test's capture; a CI-like run printed
    # "--- Logging error --- I/O operation on closed file" for every operator line of later tests).
    gone = io.StringIO()
    monkeypatch.setattr(sys, "stderr", gone)
    logs.setup("info", "text")
    gone.close()
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    logging.getLogger("tessera.test").warning("still heard")
    (line,) = now.getvalue().splitlines()  # the record, and no "--- Logging error ---" report
    assert line.endswith("still heard"), line
