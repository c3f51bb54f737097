"""A budgeted refresh embeds the files that best match the query first (issue 29: the README's
"kill the whole process tree on timeout" over etude's own tree answered from docs and bench files,
because the first call's 30 s had embedded whatever the directory walk met first and
etude/sandbox/process.py was not among them)."""

from __future__ import annotations

import time

from etude.protocols import ToolContext, ToolsConfig
from etude.search import SearchConfig, chunk_file
from etude.search.index import focused
from etude.tools.semantic_search import TOOL

KILL = '''
import os
import signal


def kill_tree(proc, cgroup):
    """SIGKILL the launcher's process group, then every member of the command's cgroup."""
    os.killpg(proc.pid, signal.SIGKILL)
    cgroup.kill_all()
'''


def _filler(i: int) -> str:
    return f'def helper_{i}(rows):\n    """Sum the values of column {i} over the rows."""\n    return sum(r[{i}] for r in rows)\n'


def test_focused_puts_the_best_matching_file_first_and_keeps_the_walk_order_otherwise() -> None:
    files = {f"pkg/m{i:02d}.py": _filler(i) for i in range(20)}
    files["pkg/zz_process.py"] = KILL  # last in the walk
    chunks = {rel: chunk_file(rel, text.encode()) for rel, text in files.items()}
    order = list(focused(chunks, "kill the whole process tree on timeout"))
    assert order[0] == "pkg/zz_process.py"
    assert order[1:] == [f"pkg/m{i:02d}.py" for i in range(20)]  # no match: the walk's order, unchanged


def test_first_budgeted_call_embeds_and_finds_the_file_the_query_is_about(tmp_path, make_repo, recorder) -> None:
    inner = recorder.embed

    def slow(texts, *, query=False):
        if not query:
            time.sleep(0.2)
        return inner(texts, query=query)

    recorder.embed = slow
    files = {f"m{i:02d}.py": _filler(i) for i in range(60)}
    files["zz_process.py"] = KILL  # the directory walk meets it late, if at all within the budget
    ws = make_repo(tmp_path / "big", files)
    cfg = SearchConfig(embedder="recording", embed_batch=8, tool_budget_s=0.1)
    res = TOOL.run({"query": "kill the whole process tree on timeout", "k": 5},
                   ToolContext(workspace=ws, config=ToolsConfig(search=cfg)))
    assert res.ok and res.meta["index"]["files_pending"] > 40  # one small batch embedded, most files left
    assert res.meta["results"][0]["symbol"] == "kill_tree", res.output
    assert any("def kill_tree" in t for t in recorder.calls[0])  # it was in the very first batch
