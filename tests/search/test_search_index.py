"""The incremental index: content-hash keyed, one changed file -> one file re-embedded,
template reuse, persistence, hybrid ranking with exact identifiers."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from etude.errors import EtudeError
from etude.search import SearchConfig, open_index
from etude.search import index as index_mod
from etude.search.lexical import BM25, term_counts, tokenize

CFG = SearchConfig(embedder="recording")


def test_full_index_then_nothing_to_do(repo, recorder):
    idx = open_index(repo, config=CFG)
    first = idx.refresh()
    assert first.files == 3 and first.files_changed == 3
    assert first.chunks == first.chunks_embedded == len(recorder.embedded) > 0
    again = idx.refresh()
    assert (again.files_changed, again.chunks_embedded, again.files_removed) == (0, 0, 0)
    assert len(recorder.embedded) == first.chunks


def test_one_changed_file_is_the_only_one_reembedded(repo, recorder):
    idx = open_index(repo, config=CFG)
    idx.refresh()
    before = len(recorder.embedded)
    path = repo / "pkg/text.py"
    path.write_text(path.read_text().replace("aeiou", "aeiouy"))
    stats = idx.refresh()
    assert stats.files_changed == 1 and stats.files_removed == 0
    new = recorder.embedded[before:]
    assert new and all(t.startswith("pkg/text.py ") for t in new)
    # Only the edited function's text is new; slugify's chunk came from the cache.
    assert len(new) == stats.chunks_embedded == 1 and "count_vowels" in new[0]
    assert stats.chunks_from_cache >= 1
    assert idx.search("count_vowels", k=1)[0].symbol == "count_vowels"


def test_touch_without_change_is_not_reembedded_and_deletes_are_dropped(repo, recorder):
    idx = open_index(repo, config=CFG)
    idx.refresh()
    n = len(recorder.embedded)
    os.utime(repo / "pkg/geometry.py", ns=(1, 1))  # new mtime, same bytes
    (repo / "README.md").unlink()
    stats = idx.refresh()
    assert (stats.files_changed, stats.files_removed, stats.files) == (0, 1, 2)
    assert len(recorder.embedded) == n
    assert all(h.path != "README.md" for h in idx.search("helpers for shapes and text", k=50))


def test_index_persists_across_processes(repo, recorder):
    open_index(repo, config=CFG).refresh()
    index_mod._open.clear()  # as if a new process opened it
    idx = open_index(repo, config=CFG)
    assert idx.n_chunks > 0
    stats = idx.refresh()
    assert stats.files_changed == 0 and stats.chunks_embedded == 0
    assert list((index_mod.cache_root()).glob("*/index.sqlite"))


def test_workspace_from_template_reuses_the_template_index(tmp_path, repo, recorder):
    open_index(repo, config=CFG).refresh()
    n = len(recorder.embedded)
    ws = tmp_path / "ws"
    shutil.copytree(repo, ws)  # copy2 keeps mtimes, as an overlay's lower layer does
    idx = open_index(ws, template=repo, config=CFG)
    stats = idx.refresh()
    assert stats.files_changed == 0 and len(recorder.embedded) == n
    (ws / "pkg/new.py").write_text("def brand_new_helper():\n    return 42\n")
    stats = idx.refresh()
    assert stats.files_changed == 1 and stats.chunks_embedded == 1
    assert idx.search("brand_new_helper", k=1)[0].path == "pkg/new.py"
    # The template's own index did not see the workspace's file.
    tpl = open_index(repo, config=CFG)
    assert "pkg/new.py" not in tpl.files
    assert not list(index_mod.cache_root().glob("*/index.sqlite"))[1:]  # nothing persisted for ws


def test_worktree_style_copy_with_new_mtimes_hashes_instead_of_embedding(tmp_path, repo, recorder):
    open_index(repo, config=CFG).refresh()
    n = len(recorder.embedded)
    ws = tmp_path / "ws"
    shutil.copytree(repo, ws, copy_function=shutil.copy)  # fresh mtimes, same content
    stats = open_index(ws, template=repo, config=CFG).refresh()
    assert stats.files_changed == 0 and len(recorder.embedded) == n


def test_same_content_elsewhere_comes_from_the_shared_cache(tmp_path, repo, recorder):
    open_index(repo, config=CFG).refresh()
    n = len(recorder.embedded)
    other = tmp_path / "other"
    shutil.copytree(repo, other, copy_function=shutil.copy)
    stats = open_index(other, config=CFG).refresh()  # no template given: its own index
    assert stats.files_changed == 3 and stats.chunks_embedded == 0 and len(recorder.embedded) == n


def test_exact_identifier_is_pinned_first(repo, recorder):
    idx = open_index(repo, config=CFG)
    idx.refresh()
    for query, symbol in [("circle_area", "circle_area"), ("where is Rectangle.area defined", "Rectangle.area"),
                          ("slugify", "slugify")]:
        top = idx.search(query, k=3)[0]
        assert top.symbol == symbol, (query, top)
    hit = idx.search("circle_area", k=1)[0]
    assert (hit.path, hit.start_line, hit.end_line) == ("pkg/geometry.py", 5, 7)


def test_search_bad_input(repo, recorder, tmp_path):
    idx = open_index(repo, config=CFG)
    idx.refresh()
    with pytest.raises(EtudeError, match="query is empty"):
        idx.search("   ")
    with pytest.raises(EtudeError, match="not a directory"):
        open_index(tmp_path / "missing", config=CFG)
    with pytest.raises(EtudeError, match="unknown embedder"):
        open_index(repo, config=SearchConfig(embedder="no-such-model"))


def test_skips_hidden_build_binary_and_huge_files(repo, recorder):
    (repo / ".git").mkdir()
    (repo / ".git" / "config.py").write_text("def hidden(): pass\n")
    (repo / "node_modules").mkdir()
    (repo / "node_modules" / "x.js").write_text("function x() {}\n")
    (repo / "blob.py").write_bytes(b"\0\1\2def binary(): pass\n")
    (repo / "big.txt").write_text("x\n" * 600_000)
    (repo / "myvenv" / "lib").mkdir(parents=True)
    (repo / "myvenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / "myvenv" / "lib" / "dep.py").write_text("def dep(): pass\n")
    (repo / "env").mkdir()  # a real package that happens to be called env
    (repo / "env" / "settings.py").write_text("def load_settings(): pass\n")
    idx = open_index(repo, config=CFG)
    idx.refresh()
    assert set(idx.files) == {"pkg/geometry.py", "pkg/text.py", "README.md", "env/settings.py"}


def test_bm25_prefers_the_document_with_rare_matching_terms():
    docs = ["def parse_config(path): read the yaml config", "def render(page): html output", "config = 1"]
    bm = BM25.build([term_counts(d) for d in docs])
    s = bm.scores("parse config file")
    assert s[0] > s[2] > s[1] == 0
    assert "parse_config" in tokenize("parse_config") and "config" in tokenize("parseConfig")
    assert np.all(BM25.build([]).scores("x") == 0)


def test_edits_are_seen_through_a_delta_without_restacking(tmp_path, make_repo, recorder):
    files = {f"mod{i}.py": f"def helper_{i}(x):\n    return x * {i}\n\n\ndef other_{i}():\n    pass\n" for i in range(60)}
    ws = make_repo(tmp_path / "many", files)
    idx = open_index(ws, config=CFG)
    idx.refresh()
    main = idx.view().main
    (ws / "mod7.py").write_text("def renamed_helper(x):\n    return x * 7\n")
    (ws / "mod8.py").unlink()
    idx.refresh()
    assert idx.view().main is main and idx.view().delta is not None  # only the edited file was stacked
    names = {h.symbol for h in idx.search("helper_7 other_8 renamed_helper", k=50)}
    assert "renamed_helper" in names and "helper_7" not in names and "other_8" not in names
    assert idx.search("helper_7", k=1)[0].symbol != "helper_7"  # the stale row is not pinned either
    for i in range(20, 40):  # many files changed: the big block is rebuilt
        (ws / f"mod{i}.py").write_text(f"def fresh_{i}():\n    pass\n")
    idx.refresh()
    view = idx.view()
    assert view.main is not main and view.delta is None and not view.dead.any()
    assert idx.search("fresh_25", k=1)[0].symbol == "fresh_25"


def test_module_cli_indexes_queries_and_refuses_a_missing_dir(repo, tmp_path, capsys):
    from etude.search.__main__ import main

    assert main(["index", str(repo), "--embedder", "hash"]) == 0
    assert '"files": 3' in capsys.readouterr().out
    assert main(["query", str(repo), "area of a circle", "-k", "1", "--embedder", "hash"]) == 0
    assert capsys.readouterr().out.startswith("pkg/geometry.py:5-7  circle_area")
    assert main(["index", str(tmp_path / "nope"), "--embedder", "hash"]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["overlay", "worktree"])
def test_sandbox_workspaces_find_their_template_by_themselves(repo, recorder, kind):
    """An episode's workspace (etude.sandbox.Workspace) reuses the template's index with no hint."""
    import subprocess

    sandbox = pytest.importorskip("etude.sandbox")
    if kind == "worktree":
        git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    open_index(repo, config=CFG).refresh()
    n = len(recorder.embedded)
    try:
        ws = sandbox.Workspace.create(repo, kind=kind)
    except Exception as e:  # noqa: BLE001 - overlay needs root and a kernel that allows it
        pytest.skip(f"no {kind} workspace here: {e}")
    with ws:
        assert index_mod.detect_template(ws.path.resolve()) == repo.resolve()
        idx = open_index(ws.path, config=CFG)
        assert idx.db is None  # in memory: nothing persisted for the workspace
        stats = idx.refresh()
        assert stats.files_changed == 0 and len(recorder.embedded) == n
    assert index_mod.detect_template(repo) is None
