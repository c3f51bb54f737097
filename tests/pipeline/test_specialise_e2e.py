"""`etude specialise` end to end on a small local git repository with the tiny random model: every
stage runs for real (curriculum in the sandbox, LoRA SFT, edit-turn GRPO, paired evaluations),
the split leaks no held-out function, the artefact is an adapter, --register makes it the org's
candidate and no other org sees it, and a rerun resumes."""

import json
import subprocess

import pytest

pytestmark = [pytest.mark.slow]

LIB = '''def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    s = 0
    for x in xs:
        s = s + x
    return s


def count_pos(xs):
    n = 0
    for x in xs:
        if x > 0:
            n = n + 1
    return n


def scale(xs, k):
    return [x * k for x in xs]


def last(xs, default):
    if len(xs) > 0:
        return xs[-1]
    return default


def span(xs):
    return max(xs) - min(xs)
'''

TESTS = '''from mini.core import clamp, count_pos, last, scale, span, total


def test_clamp():
    assert clamp(-5, 0, 10) == 0
    assert clamp(50, 0, 10) == 10
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6


def test_count_pos():
    assert count_pos([1, -2, 3, 0]) == 2


def test_scale():
    assert scale([1, 2], 3) == [3, 6]


def test_last():
    assert last([1, 2], 0) == 2
    assert last([], 7) == 7


def test_span():
    assert span([3, 9, 4]) == 6
'''


@pytest.fixture
def org_repo(tmp_path):
    root = tmp_path / "acme-lib"
    (root / "mini").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "mini" / "__init__.py").write_text("")
    (root / "mini" / "core.py").write_text(LIB)
    (root / "tests" / "test_core.py").write_text(TESTS)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=root, check=True)
    return root


def test_specialise_end_to_end(tmp_path, org_repo, monkeypatch):
    from etude.pipeline.specialise import SpecialiseConfig, run_specialise
    from etude.pipeline.split import check_disjoint, touched_functions
    from etude.tasks import load_tasks

    monkeypatch.setenv("ETUDE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ETUDE_DB", f"sqlite:///{tmp_path / 'etude.db'}")
    out = tmp_path / "spec"
    cfg = SpecialiseConfig(org="acme", repos=(str(org_repo),), out=str(out), base="tiny", minutes=1.0,
                           tasks_per_repo=16, drills_per_repo=8, min_heldout=2, general=str(org_repo / "gen.jsonl"),
                           general_tasks=3, sft_epochs=1.0, rl_step_s=10.0, backend="hf", workers=2, register=True)
    # the general suite: any task file of no org function (here: the drills' seed of the same code, for speed)
    from etude.pipeline.specialise import repo_tasks
    from etude.tasks import save_tasks

    save_tasks(repo_tasks(str(org_repo), 3, 11), org_repo / "gen.jsonl")
    rep = run_specialise(cfg)

    split = json.loads((out / "split.json").read_text())
    train, held = load_tasks(out / "tasks" / "train.jsonl"), load_tasks(out / "tasks" / "heldout.jsonl")
    touched = {t.instance_id: touched_functions(t) for t in train + held}
    check_disjoint(train, held, touched)
    assert split["heldout"]["n_tasks"] == len(held) >= 2
    assert not set(split["heldout"]["functions"]) & set(split["train"]["functions"])
    drills = load_tasks(out / "tasks" / "drills.jsonl")
    assert all(touched_functions(t) <= set(split["train"]["functions"]) for t in drills)

    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "adapter" / "config.json").exists()
    assert rep["adapter"]["bytes"] < 20 * 2**20
    h = rep["heldout"]
    assert h["tasks"] == len(held) and set(h["base"]) >= {"resolved", "rate", "ci95"}
    assert 0 <= h["mcnemar_p"] <= 1 and h["gained"] + h["lost"] <= h["tasks"]
    assert isinstance(rep["general"]["no_regression"], bool)
    assert rep["provenance"]["git_commit"] and rep["stages"]
    assert (out / "report.html").read_text().count("Held-out functions") == 1

    from etude.serve import registry
    from etude.store import open_store

    store = open_store()
    cp = registry.get_checkpoint(store, rep["registered"]["name"])
    assert cp.org_id == "acme" and cp.state == "candidate" and cp.path == str(out / "adapter")
    assert cp.visible_to("acme") and not cp.visible_to("globex")
    assert all(c.name != cp.name for c in registry.list_checkpoints(store, "globex", include_retired=True)
               if c.org_id is not None)

    # a rerun resumes: every stage is read back, nothing is trained again
    mtime = (out / "adapter" / "adapter_model.safetensors").stat().st_mtime
    rep2 = run_specialise(cfg)
    assert all(v["resumed"] for k, v in rep2["stages"].items() if not k.startswith("7"))
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_mtime == mtime
