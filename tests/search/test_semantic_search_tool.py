"""The semantic_search tool: protocol, bounded compact output, bad input as observations, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from etude.protocols import Tool, ToolContext, ToolsConfig
from etude.search import SearchConfig
from etude.tools.semantic_search import MAX_K, MAX_OUTPUT_CHARS, TOOL

SEARCH = ToolsConfig(search=SearchConfig(embedder="recording"))


def ctx(ws: Path, template: str | None = None) -> ToolContext:
    return ToolContext(workspace=ws, config=SEARCH, template=template)


def test_implements_the_tool_protocol_with_a_bounded_schema():
    assert isinstance(TOOL, Tool) and TOOL.name == "semantic_search"
    params = TOOL.schema["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["query"]["minLength"] == 1
    k = params["properties"]["k"]
    assert (k["default"], k["minimum"], k["maximum"]) == (10, 1, MAX_K)


def test_results_are_compact_path_span_symbol_and_context(repo, recorder):
    res = TOOL.run({"query": "count_vowels"}, ctx(repo))
    assert res.ok, res.error
    first = res.output.splitlines()[0]
    assert first.startswith("pkg/text.py:6-7  count_vowels (function)")
    assert "def count_vowels(word):" in res.output.splitlines()[1]
    meta = res.meta
    assert meta["results"][0]["symbol"] == "count_vowels" and len(meta["results"]) <= 10
    assert meta["index"]["files"] == 3


def test_output_is_bounded(tmp_path, make_repo, recorder):
    body = "\n".join(f"    value_{i} = compute_thing({i})  # " + "x" * 300 for i in range(30))
    files = {f"m{i}.py": f"def compute_thing_{i}(a):\n{body}\n" for i in range(60)}
    ws = make_repo(tmp_path / "big", files)
    res = TOOL.run({"query": "compute thing", "k": MAX_K}, ctx(ws))
    assert res.ok
    assert len(res.output) <= MAX_OUTPUT_CHARS + 200
    assert res.meta["omitted"] == 0 or "more results left out" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 200


@pytest.mark.parametrize(
    "args, message",
    [
        ({"query": ""}, "query is empty"),
        ({"query": "   "}, "query is empty"),
        ({}, "query is empty"),
        ({"query": 3}, "query is empty"),
        ({"query": "x", "k": 0}, "k must be an integer"),
        ({"query": "x", "k": MAX_K + 1}, "k must be an integer"),
        ({"query": "x", "k": True}, "k must be an integer"),
        ({"query": "x", "limit": 3}, "unknown argument"),
        ("not a dict", "must be a JSON object"),
    ],
)
def test_bad_arguments_are_observations(repo, recorder, args, message):
    res = TOOL.run(args, ctx(repo))
    assert not res.ok and message in res.error
    assert res.meta["error_kind"] == "invalid_arguments"


def test_missing_workspace_is_an_observation(tmp_path, recorder):
    res = TOOL.run({"query": "anything"}, ctx(tmp_path / "nope"))
    assert not res.ok and "not a directory" in res.error and res.meta["error_kind"] == "bad_workspace"


def test_template_in_context_is_reused(tmp_path, repo, recorder):
    import shutil

    TOOL.run({"query": "slugify"}, ctx(repo))
    n = len(recorder.embedded)
    ws = tmp_path / "ws"
    shutil.copytree(repo, ws)
    res = TOOL.run({"query": "slugify"}, ctx(ws, template=str(repo)))
    assert res.ok and res.meta["index"]["chunks_embedded"] == 0 and len(recorder.embedded) == n


@pytest.mark.slow  # each `etude` process imports every component's CLI: seconds apiece here
def test_registry_and_cli(repo, search_cache):
    """Through the tools engineer's registry and `etude tool` (hash embedder: no model load)."""
    tools = pytest.importorskip("etude.tools")
    res = tools.run_tool("semantic_search", {"query": ""}, ToolContext(workspace=repo))
    assert not res.ok  # the registry's schema check refuses it before the tool runs
    env = {**os.environ, "ETUDE_SEARCH_EMBEDDER": "hash", "ETUDE_CACHE": str(search_cache)}
    argv = [sys.executable, "-m", "etude.cli", "tool", "semantic_search", "--workspace", str(repo), "--args"]
    out = subprocess.run([*argv, json.dumps({"query": "area of a circle", "k": 2})], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["meta"]["results"][0]["symbol"] == "circle_area" and len(doc["meta"]["results"]) == 2
    missing = subprocess.run([*argv[:5], str(repo / "nope"), "--args", '{"query": "x"}'], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_first_call_on_a_big_repo_answers_within_its_budget(tmp_path, make_repo, recorder):
    """A slow model: the tool embeds one batch, answers, and says the index is incomplete."""
    import time as _time

    inner = recorder.embed

    def slow(texts, *, query=False):
        if not query:
            _time.sleep(0.2)
        return inner(texts, query=query)

    recorder.embed = slow
    files = {f"m{i}.py": f"def fn_{i}():\n    return {i}\n" for i in range(40)}
    ws = make_repo(tmp_path / "slow", files)
    cfg = SearchConfig(embedder="recording", embed_batch=8, tool_budget_s=0.1)
    res = TOOL.run({"query": "fn_3"}, ToolContext(workspace=ws, config=ToolsConfig(search=cfg)))
    assert res.ok and 0 < res.meta["index"]["files_pending"] < 40
    assert "still being built" in res.output
    for _ in range(10):
        res = TOOL.run({"query": "fn_39"}, ToolContext(workspace=ws, config=ToolsConfig(search=cfg)))
        if not res.meta["index"]["files_pending"]:
            break
    assert res.meta["index"]["files_pending"] == 0 and "still being built" not in res.output
    assert res.meta["results"][0]["symbol"] == "fn_39"


def test_parallel_calls_from_threads(tmp_path, repo, recorder):
    """The harness runs tool calls in parallel: workspaces of one template share its cache connection."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    spaces = []
    for i in range(4):
        ws = tmp_path / f"ws{i}"
        shutil.copytree(repo, ws)
        (ws / f"extra_{i}.py").write_text(f"def only_in_ws_{i}():\n    return {i}\n")
        spaces.append(ws)

    def call(i):
        return TOOL.run({"query": f"only_in_ws_{i}", "k": 1}, ctx(spaces[i], template=str(repo)))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    assert [r.meta["results"][0]["symbol"] for r in results] == [f"only_in_ws_{i}" for i in range(4)]


def test_unindexed_template_does_not_block_the_first_call(tmp_path, make_repo, recorder):
    """Regression: a workspace of a never-indexed template refreshed the template without a budget."""
    import shutil
    import time as _time

    inner = recorder.embed

    def slow(texts, *, query=False):
        if not query:
            _time.sleep(0.2)
        return inner(texts, query=query)

    recorder.embed = slow
    tpl = make_repo(tmp_path / "tpl", {f"m{i}.py": f"def fn_{i}():\n    return {i}\n" for i in range(200)})
    ws = tmp_path / "ws"
    shutil.copytree(tpl, ws)
    cfg = SearchConfig(embedder="recording", tool_budget_s=0.1)
    res = TOOL.run({"query": "fn_1"}, ToolContext(workspace=ws, config=ToolsConfig(search=cfg), template=tpl))
    assert res.ok and res.meta["index"]["files_pending"] > 0
    assert len(recorder.calls) <= 3  # about one batch for the template, one for the workspace
