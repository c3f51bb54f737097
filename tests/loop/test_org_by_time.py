"""An adapter of `etude specialise --until` in the org's cycle: registered as the org's candidate,
the cycle canaries it instead of training one, and its gate reads the run's gate lines (never the
report's held-out lines) beside the held-out tasks. On the tiny model a few seconds of training
do not lower the loss, so the code gate fails and the cycle rolls back saying why: the gate can
fail."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from etude.loop import LoopConfig, TrafficContext, run_cycle
from etude.loop.config import AlarmSection, CanarySection, EvalSection, TrafficConfig, TrainSection
from etude.pipeline.specialise_time import TimeSpecialiseConfig, run_time_specialise
from etude.serve import registry
from etude.store import open_store
from tests.pipeline.test_timesplit import GUIDE, MOD_V1, MOD_V2, MOD_V3, TEST_V3
from tests.tasks.test_history import _commit, _git


@pytest.mark.slow
def test_a_by_time_adapter_is_gated_on_its_gate_lines_and_rolled_back_when_no_better(tmp_path: Path) -> None:
    repo = tmp_path / "orgrepo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"pkg/__init__.py": "", "pkg/mod.py": MOD_V1, "docs/guide.md": GUIDE}, "one",
            "2024-01-10T12:00:00+00:00")
    _commit(repo, {"pkg/mod.py": MOD_V2}, "two", "2024-03-01T12:00:00+00:00")
    _commit(repo, {"pkg/mod.py": MOD_V3, "tests/test_mod.py": TEST_V3}, "three", "2024-04-01T12:00:00+00:00")

    cfg = LoopConfig(
        root=str(tmp_path / "root"), name="t", model="tiny", seed=1,
        traffic=TrafficConfig(kind="none", tasks="builtin:train", max_tasks=1),
        train=TrainSection(steps=1, batch_size=4, lr=1e-3, lora_r=2),
        eval=EvalSection(max_tasks=2, min_tasks=2, max_steps=1, max_tokens=8),
        canary=CanarySection(rounds=1, guardrails=(), mde=0.5), alarms=AlarmSection(rules=()),
    ).for_org("acme")
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    store.create_key("acme", name="acme-ci")  # the org's own key (the loop makes its own for traffic)

    run = tmp_path / "spec"
    rep = run_time_specialise(TimeSpecialiseConfig(org="acme", repos=(str(repo),), until=("2024-02-01",),
                                                   out=str(run), base="tiny", minutes=0.02, items=6, gate_items=6,
                                                   register=True, db=cfg.db_url()))
    cand = registry.get_checkpoint(store, rep["registered"]["name"])
    assert cand.state == "candidate" and cand.meta["kind"] == "specialised-by-time"
    held = {json.loads(x)["id"] for x in (run / "orgrepo" / "items.jsonl").read_text().splitlines()}
    gate = {json.loads(x)["id"] for x in (run / "orgrepo" / "gate.jsonl").read_text().splitlines()}
    assert held and gate and not held & gate

    def traffic(ctx: TrafficContext) -> None:
        url = ctx.server()
        for u in range(4):
            r = httpx.post(f"{url}/chat/completions", timeout=120,
                           headers={"authorization": f"Bearer {ctx.api_key}", "x-etude-session": f"{ctx.phase}-{u}"},
                           json={"model": "auto", "user": f"a-{u}", "max_tokens": 3,
                                 "messages": [{"role": "user", "content": "fix it"}]})
            assert r.status_code == 200, r.text

    out = run_cycle(cfg, traffic=traffic, progress=False).to_dict()
    assert out["train"]["specialised"] == cand.name and out["train"]["steps"] == 0  # canaried, not trained
    code = out["eval"]["code"]
    assert code["lines"] == len(gate) and set(code["repos"]) == {"orgrepo"}
    assert code["passed"] is False and "not lower" in code["why"]
    assert out["decision"] == "rollback" and "code gate" in out["reason"]
