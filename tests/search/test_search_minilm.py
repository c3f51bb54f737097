"""Ranking with the real model (all-MiniLM-L6-v2, offline) on a small real repository: h11."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from etude.protocols import ToolContext, ToolsConfig
from etude.search import SearchConfig, get_embedder, open_index

h11 = pytest.importorskip("h11")

QUERIES = [
    ("does the client expect a 100 Continue reply before it sends the request body", "has_expect_100_continue"),
    ("join header lines that were folded onto continuation lines", "_obsolete_line_fold"),
    ("split a comma separated header into its lower-cased values", "get_comma_header"),
]


@pytest.fixture(scope="module")
def h11_repo(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("h11") / "h11"
    shutil.copytree(Path(h11.__file__).parent, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.mark.slow  # embeds ~170 chunks with MiniLM on CPU
def test_a_description_finds_its_function_in_the_top_3(h11_repo):
    emb = get_embedder("minilm")
    assert emb.dim == 384 and emb.id.startswith("all-MiniLM-L6-v2/")
    idx = open_index(h11_repo, config=SearchConfig(embedder="minilm"))
    stats = idx.refresh()
    assert stats.chunks_embedded == stats.chunks > 100
    for query, symbol in QUERIES:
        top3 = [h.symbol for h in idx.search(query, k=3)]
        assert symbol in top3, (query, top3)
    # Through the tool, after an edit: only the edited file's changed chunks reach the model.
    from etude.tools.semantic_search import TOOL

    path = h11_repo / "_headers.py"
    path.write_text(path.read_text() + "\n\ndef strip_hop_by_hop(headers):\n    \"\"\"Drop Connection and Keep-Alive headers before forwarding.\"\"\"\n    return headers\n")
    res = TOOL.run({"query": "remove hop-by-hop headers such as Connection before forwarding", "k": 3},
                   ToolContext(workspace=h11_repo, config=ToolsConfig(search=SearchConfig(embedder="minilm"))))
    assert res.ok, res.error
    assert res.meta["index"]["files_changed"] == 1 and 1 <= res.meta["index"]["chunks_embedded"] <= 3
    assert res.meta["results"][0]["symbol"] == "strip_hop_by_hop"
