"""Descriptions of etude's own functions find them in the top 5, over etude's whole tracked tree
with the default model (issue 29: the README tour's "kill the whole process tree on timeout" must
return `kill_tree` in etude/sandbox/process.py, as an agent asking it wants the code)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from etude.paths import cache
from etude.protocols import ToolContext, ToolsConfig
from etude.search import SearchConfig, open_index
from etude.tools.semantic_search import TOOL

ROOT = Path(__file__).resolve().parents[2]
MACHINE_CACHE = cache()  # read before the autouse fixture points ETUDE_CACHE at a fresh folder

QUERIES = [
    ("kill the whole process tree on timeout", "etude/sandbox/process.py", "kill_tree"),
    ("Wilson score interval of a rate", "etude/evals/stats.py", "wilson_ci"),
    ("exact McNemar test on the discordant pairs", "etude/evals/stats.py", "mcnemar_exact"),
    ("BM25 score of every chunk", "etude/search/lexical.py", "BM25.scores"),
]


@pytest.fixture
def own_tree(tmp_path: Path, search_cache: Path) -> Path:
    """A copy of the repository's tracked files; the machine's embedding cache copied beside it.

    The copy only saves time: vectors are keyed by sha256(model id, exact text), so a cached
    vector is the one the model would compute."""
    dest = tmp_path / "etude"
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, (n.decode() for n in names)):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    src = MACHINE_CACHE / "search" / "embeddings.sqlite"
    if src.is_file():
        (search_cache / "search").mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(src) as a, sqlite3.connect(search_cache / "search" / "embeddings.sqlite") as b:
            a.backup(b)
    return dest


@pytest.mark.slow  # embeds about 4,000 chunks with MiniLM on CPU when the machine's cache lacks them
@pytest.mark.timeout(3600)
def test_descriptions_find_etude_functions_in_the_top_5(own_tree: Path) -> None:
    idx = open_index(own_tree, config=SearchConfig(embedder="minilm"))
    stats = idx.refresh()
    assert stats.files_pending == 0 and stats.chunks > 2000
    for query, path, symbol in QUERIES:
        top5 = [(h.path, h.symbol) for h in idx.search(query, k=5)]
        assert (path, symbol) in top5, (query, top5)
    # the README's command: through the tool, as the model calls it
    res = TOOL.run({"query": QUERIES[0][0], "k": 5},
                   ToolContext(workspace=own_tree, config=ToolsConfig(search=SearchConfig(embedder="minilm"))))
    assert res.ok and "etude/sandbox/process.py" in res.output and "kill_tree" in res.output, res.output
