"""The parser on a corpus of well-formed and malformed model outputs (tests/harness/data/parse_corpus.jsonl,
written by data/make_corpus.py), plus `etude parse` run as a real command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etude.harness import parse_openai_tool_calls, parse_output, render_tool_calls_text
from etude.types import ToolCall

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "data" / "parse_corpus.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus(case):
    res = parse_output(case["input"], case["format"], tools=case.get("tools"))
    exp = case["expect"]
    assert [{"name": c.name, "arguments": c.arguments} for c in res.tool_calls] == exp["calls"]
    assert len(res.errors) == len(exp["errors"]), res.errors
    for err, want in zip(res.errors, exp["errors"], strict=True):
        assert want in err
        assert "\n" not in err  # one line each: they go into a bulleted observation
    if "text" in exp:
        assert res.text == exp["text"]
    if "ids" in exp:
        assert [c.id for c in res.tool_calls] == exp["ids"]
    assert len({c.id for c in res.tool_calls}) == len(res.tool_calls)


def test_corpus_covers_both_kinds():
    assert sum(1 for c in CORPUS if c["expect"]["errors"]) >= 20
    assert sum(1 for c in CORPUS if not c["expect"]["errors"]) >= 20


def test_canonical_text_round_trips():
    calls = [ToolCall("x", "edit_file", {"path": "a.py", "old_str": "a\n", "new_str": "</tool_call>"}), ToolCall("y", "list_dir", {})]
    res = parse_output("Fixing.\n" + render_tool_calls_text(calls))
    assert [(c.name, c.arguments) for c in res.tool_calls] == [(c.name, c.arguments) for c in calls]
    assert res.text == "Fixing." and res.errors == ()


def test_openai_tool_calls_keeps_server_ids_and_reports_each_bad_entry():
    raw = [
        {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "grep", "arguments": "{'pattern': 'x'}"}},
        "not a dict",
    ]
    res = parse_openai_tool_calls(raw)
    assert [c.id for c in res.tool_calls] == ["call_1"]
    assert len(res.errors) == 2 and res.errors[0].startswith("tool call 2:") and res.errors[1].startswith("tool call 3:")


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown format"):
        parse_output("x", "xml")


def _parse_cmd(*args, stdin=""):
    """`etude parse` in-process, through a Typer app holding only this component's commands
    (the full `etude` start-up imports every component, which is slow)."""
    import typer
    from typer.testing import CliRunner

    from etude.harness.cli import register

    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, ["parse", *args], input=stdin)


def test_etude_parse_prints_one_json_object():
    text = "Looking.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n</tool_call>\n<tool_call>{\"name\": \"grep\",}</tool_call>"
    r = _parse_cmd(stdin=text)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["text"] == "Looking."
    assert out["tool_calls"] == [{"id": "call_0", "name": "read_file", "arguments": {"path": "a.py"}}]
    assert len(out["errors"]) == 1 and "invalid JSON" in out["errors"][0]


def test_etude_parse_openai_format_and_tools_filter():
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "glob", "arguments": "{\"pattern\": \"*.py\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "rm", "arguments": "{}"}}]}
    out = json.loads(_parse_cmd("--format", "openai", "--tools", "glob,grep", stdin=json.dumps(msg)).stdout)
    assert out["tool_calls"] == [{"id": "c1", "name": "glob", "arguments": {"pattern": "*.py"}}]
    assert len(out["errors"]) == 1 and "unknown tool 'rm'" in out["errors"][0]


@pytest.mark.slow
def test_etude_parse_as_a_command():
    run = lambda *a, stdin="": subprocess.run([sys.executable, "-m", "etude.cli", "parse", *a], input=stdin,  # noqa: E731
                                              capture_output=True, text=True, timeout=120)
    ok = run(stdin='<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>')
    assert ok.returncode == 0 and json.loads(ok.stdout)["tool_calls"][0]["name"] == "list_dir"
    bad = run("--format", "xml")
    assert bad.returncode == 2 and "--format must be one of" in bad.stderr and "Traceback" not in bad.stderr
