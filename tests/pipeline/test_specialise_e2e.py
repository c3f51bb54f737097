"""`etude specialise` end to end on a small local git repository with the tiny random model: every
stage runs for real (curriculum in the sandbox, LoRA SFT, edit-turn GRPO, paired evaluations),
the split leaks no held-out function, the artefact is an adapter, --register makes it the org's
candidate and no other org sees it, and a rerun resumes."""

import json

import pytest

pytestmark = [pytest.mark.slow]


@pytest.fixture
def org_repo(tmp_path):
    from etude.pipeline.specialise import example_org_repo

    return example_org_repo(tmp_path / "acme-lib")


def test_specialise_end_to_end(tmp_path, org_repo, monkeypatch):
    from etude.pipeline.specialise import SpecialiseConfig, run_specialise
    from etude.pipeline.split import check_disjoint, touched_functions
    from etude.tasks import load_tasks

    monkeypatch.setenv("ETUDE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ETUDE_DB", f"sqlite:///{tmp_path / 'etude.db'}")
    out = tmp_path / "spec"
    cfg = SpecialiseConfig(org="acme", repos=(str(org_repo),), out=str(out), base="tiny", minutes=1.0,
                           tasks_per_repo=16, drills_per_repo=8, min_heldout=2, general=str(tmp_path / "gen.jsonl"),
                           general_tasks=3, sft_epochs=1.0, rl_step_s=10.0, backend="hf", workers=2, register=True)
    # the general suite: any task file of no org function (here: the drills' seed of the same code, for speed)
    from etude.pipeline.specialise import repo_tasks
    from etude.tasks import save_tasks

    save_tasks(repo_tasks(str(org_repo), 3, 11), tmp_path / "gen.jsonl")
    part = run_specialise(cfg, until="2b. drills")  # stops there: nothing trained yet
    assert part["until"] == "2b. drills" and list(part["stages"]) == ["1. tasks", "2. split", "2b. drills"]
    assert not (out / "sft").exists()
    rep = run_specialise(cfg)
    assert rep["stages"]["2b. drills"]["resumed"] and not rep["stages"]["3. SFT (LoRA)"]["resumed"]

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
    assert cp.org_id == "acme" and cp.state == "candidate" and cp.version == 1
    assert cp.path == str(out / "adapters" / cp.meta["sha256"][:16])  # an immutable snapshot of out/adapter
    assert registry.adapter_digest(cp.path) == registry.adapter_digest(out / "adapter") == cp.meta["sha256"]
    assert cp.visible_to("acme") and not cp.visible_to("globex")
    assert all(c.name != cp.name for c in registry.list_checkpoints(store, "globex", include_retired=True)
               if c.org_id is not None)

    # a rerun resumes: every stage is read back, nothing is trained again
    mtime = (out / "adapter" / "adapter_model.safetensors").stat().st_mtime
    rep2 = run_specialise(cfg)
    assert all(v["resumed"] for k, v in rep2["stages"].items() if not k.startswith("7"))
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_mtime == mtime
