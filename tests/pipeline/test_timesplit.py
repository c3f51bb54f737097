"""Specialisation by time: the cut-off, what trains, what is held out, the leak proof, the measures
and `etude specialise --until` end to end on a tiny model."""

import json
import math
import os
import subprocess
import sys

import pytest

from etude.errors import EtudeError
from etude.tasks.timesplit import (
    LeakError,
    build_split,
    check_no_leak,
    defined_names,
    heldout_items,
    resolve_cutoff,
    resolve_repo,
    training_documents,
)
from tests.tasks.test_history import _commit, _git  # the git helpers the history tests build repositories with

MOD_V1 = '''def slugify(text):
    return text.lower().replace(" ", "-")


def shout(text):
    return text.upper() + "!"
'''

MOD_V2 = MOD_V1 + '''

def title_slug(text):
    words = [w.capitalize() for w in text.split()]
    return slugify(" ".join(words))
'''

MOD_V3 = MOD_V2 + '''

def whisper(text):
    quiet = text.lower()
    return quiet + "..."
'''

TEST_V3 = '''from pkg.mod import title_slug, whisper


def test_title_slug():
    assert title_slug("hello world") == "hello-world"


def test_whisper():
    assert whisper("HEY") == "hey..."
'''


GUIDE = "# Guide\n\n" + "".join(
    f"Step {i}: call `slugify` on the title of section {i}, then `shout` the result when it is urgent.\n"
    for i in range(40))  # enough text at the cut-off to train on (the model needs some tokens)


@pytest.fixture
def repo(tmp_path):
    """Three commits: one before the cut-off (2024-02-01, tagged v1), two after it."""
    root = tmp_path / "orgrepo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    c1 = _commit(root, {"pkg/__init__.py": "", "pkg/mod.py": MOD_V1, "README.md": "# pkg\nSlugs and shouts.\n",
                        "docs/guide.md": GUIDE},
                 "Initial import", "2024-01-10T12:00:00+00:00")
    _git(root, "tag", "v1")
    c2 = _commit(root, {"pkg/mod.py": MOD_V2}, "Add title_slug", "2024-03-01T12:00:00+00:00")
    c3 = _commit(root, {"pkg/mod.py": MOD_V3, "tests/test_mod.py": TEST_V3}, "Add whisper and tests",
                 "2024-04-01T12:00:00+00:00")
    return root, (c1, c2, c3)


def test_a_date_and_a_revision_name_the_same_cut_off(repo):
    root, (c1, c2, c3) = repo
    ref = resolve_repo(str(root))
    assert ref.end == c3
    by_date = resolve_cutoff(ref, "2024-02-01")
    by_tag = resolve_cutoff(ref, "v1")
    assert by_date.sha == by_tag.sha == c1
    assert by_date.commits == (c2, c3)  # oldest first
    assert resolve_cutoff(ref, "2024-03-01").sha == c1  # before midnight of that day: c2 is on it
    assert resolve_cutoff(ref, "2024-03-02").commits == (c3,)


@pytest.mark.parametrize("until, says", [
    ("no-such-tag", "no such revision"),
    ("2023-01-01", "no commit before that day"),
    ("HEAD", "nothing after the cut-off"),
    ("2030-01-01", "nothing after the cut-off"),
])
def test_a_cut_off_that_does_not_resolve_is_one_error(repo, until, says):
    root, _ = repo
    with pytest.raises(EtudeError, match=says):
        resolve_cutoff(resolve_repo(str(root)), until)


def test_a_path_that_is_not_a_repository_is_refused(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(EtudeError, match="not a git repository"):
        resolve_repo(str(tmp_path / "plain"))
    with pytest.raises(EtudeError, match="not a directory"):
        resolve_repo(str(tmp_path / "nowhere"))
    with pytest.raises(EtudeError, match="one PyPI release has no later code"):
        resolve_repo("click==8.1.7")


def test_training_reads_only_the_cut_off_tree(repo):
    root, (c1, _, _) = repo
    cut = resolve_cutoff(resolve_repo(str(root)), "v1")
    docs = training_documents(cut)
    assert {d.path for d in docs} == {"pkg/mod.py", "README.md", "docs/guide.md"}  # an empty file has no text
    text = "".join(d.text for d in docs)
    assert "title_slug" not in text and "whisper" not in text
    assert defined_names(docs) == {"slugify", "shout"}


def test_held_out_lines_come_from_every_later_commit_with_their_file_as_context(repo):
    root, (c1, c2, c3) = repo
    cut = resolve_cutoff(resolve_repo(str(root)), "v1")
    items = heldout_items(cut, n=4, seed=0)
    assert [i.commit for i in items[:2]] == [c2, c3]  # round-robin: each commit once before any twice
    for it in heldout_items(cut, n=100, seed=0):
        assert it.commit in (c2, c3)
        at = _git(root, "show", f"{it.commit}:{it.path}").splitlines()
        assert at[it.line_no - 1] == it.line
        assert it.context == "".join(x + "\n" for x in at[:it.line_no - 1])
        assert len(it.line.strip()) >= 8 and not it.line.strip().startswith("#")
    kinds = {i.kind for i in heldout_items(cut, n=100, seed=0)}
    assert kinds == {"code", "test", "assert"}


def test_the_leak_proof_refuses_a_planted_leak(repo):
    root, (c1, c2, c3) = repo
    split = build_split(str(root), "v1", n_items=50)
    rec = split.to_dict()
    check_no_leak(rec, root)  # the honest record holds
    check_no_leak(rec, root, {d.path: d.text for d in split.documents})

    later_blob = _git(root, "rev-parse", f"{c3}:pkg/mod.py").strip()  # the file as a held-out commit left it
    planted = dict(rec, training=rec["training"] + [{"path": "pkg/mod_later.py", "blob": later_blob, "sha256": "0"}])
    with pytest.raises(LeakError, match="not in the cut-off"):
        check_no_leak(planted, root)

    texts = {d.path: d.text for d in split.documents}
    texts["pkg/mod.py"] = MOD_V3  # the right path, a later text
    with pytest.raises(LeakError, match="is not the cut-off's blob"):
        check_no_leak(rec, root, texts)

    with pytest.raises(LeakError, match="not in the split's record"):
        check_no_leak(rec, root, {**{d.path: d.text for d in split.documents}, "tests/test_mod.py": TEST_V3})

    with pytest.raises(LeakError, match="at or before the cut-off"):
        check_no_leak(dict(rec, heldout_commits=[c1, *rec["heldout_commits"]]), root)


def test_scores_are_the_teacher_forced_measures():
    import torch

    from etude.evals.codelm import load_scorer, prepare, score_items
    from etude.tasks.timesplit import Item

    model, tok = load_scorer("tiny")
    it = Item(id="x", commit="c", path="pkg/mod.py", line_no=3, context="def slugify(text):\n",
              line="    return slugify(text)", kind="code", seen_at_cutoff=False)
    (row,) = score_items(model, tok, [it], names=frozenset({"slugify"}))
    p = prepare(tok, it, 256, frozenset({"slugify"}))
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([p["ids"]])).logits.float(), -1)[0]
    a, n = p["n_ctx"], p["n_tgt"]
    tgt = torch.tensor(p["ids"][a:])
    nll = -logp[a - 1:a - 1 + n].gather(1, tgt[:, None])[:, 0]
    right = (logp[a - 1:a - 1 + n].argmax(-1) == tgt).tolist()
    assert row["ntok"] == n and math.isclose(row["nll"], float(nll.mean()), rel_tol=1e-3)
    assert row["token_acc"] == sum(right) / n and row["line_em"] == int(all(right))
    assert row["repo_names"] == ["slugify"] and row["repo_em"] in (0, 1) and row["ident_em"] in (0, 1)
    assert p["ident"] and p["repo"] and set(p["repo"]) <= set(range(n))


def test_paired_mean_clusters_resample_whole_commits():
    from etude.evals.stats import paired_mean_diff

    a = [1.0] * 32
    b = [0.9] * 30 + [1.5, 1.5]  # thirty lines of one commit better, two lines of another much worse
    flat = paired_mean_diff(a, b)
    clustered = paired_mean_diff(a, b, ["c1"] * 30 + ["c2"] * 2)
    assert flat["n_clusters"] == 32 and clustered["n_clusters"] == 2
    assert math.isclose(flat["mean_diff"], clustered["mean_diff"])
    assert flat["p"] < 0.05 < clustered["p"]  # two commits are no evidence
    assert flat["ci_low"] <= flat["mean_diff"] <= flat["ci_high"] < 0 < clustered["ci_high"]


def _spec(*args, env):
    return subprocess.run([sys.executable, "-m", "etude.cli", "specialise", *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture
def env(tmp_path):
    return {**os.environ, "ETUDE_HOME": str(tmp_path / "home"), "ETUDE_CACHE": str(tmp_path / "cache")}


@pytest.mark.parametrize("until, says", [("no-such-tag", "no such revision"), ("HEAD", "nothing after")])
def test_cli_bad_cut_off_is_one_line_and_exit_2(repo, tmp_path, env, until, says):
    root, _ = repo
    out = tmp_path / "out"
    r = _spec("--org", "acme", "--repos", str(root), "--until", until, "--base", "tiny", "--out", str(out), env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_specialise_until_end_to_end_on_a_tiny_model(repo, tmp_path, env):
    root, (c1, c2, c3) = repo
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q", "-b", "main")
    _commit(other, {"lib/a.py": MOD_V1.replace("slugify", "kebab")}, "one", "2024-01-01T00:00:00+00:00")
    _commit(other, {"lib/a.py": MOD_V3.replace("slugify", "kebab")}, "two", "2024-05-01T00:00:00+00:00")
    out = tmp_path / "out"
    args = ["--org", "acme", "--repos", str(root), "--until", "v1", "--regress", str(other), "--regress-until",
            "2024-02-01", "--base", "tiny", "--minutes", "0.05", "--items", "20", "--out", str(out), "--register"]
    r = _spec(*args, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((out / "report.json").read_text())
    split = json.loads((out / "orgrepo" / "split.json").read_text())
    assert split["cutoff"] == c1 and split["heldout_commits"] == [c2, c3]
    check_no_leak(split, root)
    figs = rep["figures"]
    assert {"orgrepo.loss", "orgrepo.rest_em", "orgrepo.adherence", "acme.regress.other.loss"} <= set(figs)
    assert figs["orgrepo.loss"]["n"] == rep["split"]["orgrepo"]["n"] > 0
    assert [c["fraction"] for c in rep["train"]["checkpoints"]] == [0.25, 0.5, 1.0]
    assert set(rep["targets"]) == {"orgrepo", "no_regression"}
    assert (out / "adapter" / "adapter_config.json").is_file()
    printed = json.loads(r.stdout.strip().splitlines()[-1])
    assert printed["registered"]["state"] == "candidate" and printed["targets"] == rep["targets"]
    again = _spec(*args, env=env)  # a rerun resumes every stage
    assert again.returncode == 0 and "from an earlier run" in again.stdout


def test_a_release_pair_is_a_repository_cut_at_its_older_release():
    """NAME==OLD..NEW: OLD's sdist is the cut-off (tag OLD), each file NEW changes one commit."""
    s = build_split("tinydb==4.8.2..4.9.0", "4.8.2", n_items=50)
    rec = s.to_dict()
    check_no_leak(rec, s.cutoff.repo.path)
    assert rec["repo"] == "tinydb" and len(rec["heldout_commits"]) >= 5 and rec["items"]["n"] == 50
    assert rec["items"]["commits"] >= 5  # clustered by file
    assert any(d.path.endswith("tinydb/table.py") for d in s.documents)
    with pytest.raises(EtudeError, match="sealed test split"):
        resolve_repo("parse==1.22.3..1.22.4")
    with pytest.raises(EtudeError, match="one PyPI release has no later code"):
        resolve_repo("tinydb==4.8.2")
    with pytest.raises(EtudeError, match="no such revision"):
        resolve_cutoff(resolve_repo("tinydb==4.8.2..4.9.0"), "4.0.0")


def test_the_shipped_checkpoint_is_chosen_on_the_cut_off_texts_held_out_blocks(tmp_path):
    from etude.pipeline.codelm import train_on_text
    from etude.tasks.timesplit import Document

    docs = [Document(path=f"m{i}.py", blob=str(i), text=MOD_V3 * 3) for i in range(12)]
    res = train_on_text("tiny", docs, tmp_path / "ck", minutes=5, checkpoints=(0.5, 1.0), block=32, batch=2,
                        epochs=0.2, seed=0)
    assert res["val_blocks"] >= 2 and res["blocks"] + res["val_blocks"] >= 20
    vals = {c["fraction"]: c["val_loss"] for c in res["checkpoints"]}
    assert all(v is not None for v in vals.values())
    assert res["chosen"] == min(vals, key=lambda f: (vals[f], f))
    few = train_on_text("tiny", docs[:1], tmp_path / "few", minutes=5, checkpoints=(1.0,), block=32, batch=2,
                        epochs=0.2)
    assert few["val_blocks"] == 0 and few["chosen"] == 1.0 and few["checkpoints"][0]["val_loss"] is None
