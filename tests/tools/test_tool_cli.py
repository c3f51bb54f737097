"""`etude tool NAME --workspace DIR --args JSON`: JSON on stdout, exit 0 when the tool ran, 2 on misuse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from etude.errors import EtudeError
from etude.tools.cli import register


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the command is called by name as in `etude`
    register(app)
    return app


def invoke(app: typer.Typer, *argv: str, stdin: str | None = None):
    return CliRunner().invoke(app, ["tool", *argv], input=stdin)


def test_tool_runs_and_prints_one_json_object(app: typer.Typer, ws: Path) -> None:
    res = invoke(app, "grep", "--workspace", str(ws), "--args", '{"pattern": "return", "path": "src"}')
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"ok", "output", "error", "meta"} and out["ok"] and out["meta"]["count"] == 2


def test_failed_tool_still_exits_zero(app: typer.Typer, ws: Path) -> None:
    res = invoke(app, "read_file", "--workspace", str(ws), "--args", '{"path": "../outside/secret.txt"}')
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["ok"] is False and "leave the workspace" in out["error"]


def test_args_from_stdin_and_schema(app: typer.Typer, ws: Path) -> None:
    res = invoke(app, "write_file", "--workspace", str(ws), "--args", "-", stdin='{"path": "n.txt", "content": "hi"}')
    assert res.exit_code == 0 and json.loads(res.stdout)["ok"] and (ws / "n.txt").read_text() == "hi"
    res = invoke(app, "edit_file", "--schema")
    assert res.exit_code == 0 and json.loads(res.stdout)["parameters"]["required"] == ["path", "old_str", "new_str"]
    res = invoke(app, "all", "--schema")
    names = [s["function"]["name"] for s in json.loads(res.stdout)]
    assert res.exit_code == 0 and names[:3] == ["read_file", "edit_file", "write_file"] and "run_terminal" in names


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rm_rf", "--workspace", "."], "unknown tool 'rm_rf'"),
        (["read_file", "--workspace", ".", "--args", "[1]"], "must be a JSON object"),
        (["read_file", "--workspace", ".", "--args", "{oops"], "not valid JSON"),
        (["read_file", "--args", "{}"], "--workspace DIR is required"),
        (["read_file", "--workspace", "/nonexistent/dir"], "is not a folder"),
    ],
)
def test_misuse_is_an_etude_error(app: typer.Typer, argv: list[str], message: str) -> None:
    res = invoke(app, *argv)
    assert isinstance(res.exception, EtudeError) and message in str(res.exception)
    assert res.exception.exit_code == 2


@pytest.mark.slow
def test_real_command_exit_codes(ws: Path) -> None:
    """The installed entry point: exit 0 with JSON, exit 2 with one line on stderr (no traceback)."""
    cmd = [sys.executable, "-m", "etude.cli", "tool"]
    ok = subprocess.run([*cmd, "list_dir", "--workspace", str(ws)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["meta"]["path"] == "."
    bad = subprocess.run([*cmd, "nope", "--workspace", str(ws)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("etude: error: unknown tool 'nope'") and "Traceback" not in bad.stderr
