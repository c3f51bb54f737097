"""Per-organisation specialisation (`etude loop --org ORG`) with the real server and store on the
tiny model: org A's LoRA adapter is trained from A's interactions only (B talks to the same server
in the same window), gated on A's held-out tasks, canaried to A's users only, promoted in A's
scope; B's arm, B's experiment and the shared production are untouched, and B's keys can neither
see nor use A's adapter. Bad input (an org without a key, or without interactions) is one line,
a non-zero exit, and nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from etude.loop import LoopConfig, TrafficContext, run_cycle
from etude.loop.config import AlarmSection, CanarySection, EvalSection, TrafficConfig, TrainSection
from etude.serve import registry
from etude.store import open_store
from tests.loop.org_cli import loop_cli, registry_snapshot


def _adapter(tmp_path: Path) -> Path:
    """Org B's own adapter (real peft weights on the tiny model)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from etude.policy.models import load_model

    model, _ = load_model("tiny")
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    out = tmp_path / "b-lora"
    pm.save_pretrained(out)
    return out


def _ask(base_url: str, key: str, user: str, session: str, model: str = "auto") -> tuple[str, str]:
    r = httpx.post(f"{base_url}/chat/completions", timeout=120, headers={"authorization": f"Bearer {key}",
                                                                          "x-etude-session": session},
                   json={"model": model, "user": user, "max_tokens": 3, "temperature": 1.0,
                         "messages": [{"role": "user", "content": f"fix the bug for {user}"}]})
    assert r.status_code == 200, r.text
    return r.headers["x-etude-interaction-id"], r.headers["x-etude-checkpoint"]


def _feedback(base_url: str, key: str, iid: str, kind: str) -> int:
    return httpx.post(f"{base_url}/feedback", timeout=30, headers={"authorization": f"Bearer {key}"},
                      json={"interaction_id": iid, "kind": kind}).status_code


@pytest.mark.slow
def test_org_adapter_is_trained_gated_canaried_and_promoted_for_its_org_only(tmp_path: Path) -> None:
    cfg = LoopConfig(
        root=str(tmp_path / "root"), name="t", model="tiny", seed=1,
        traffic=TrafficConfig(kind="none", tasks="builtin:train", max_tasks=1),
        train=TrainSection(steps=1, batch_size=4, lr=1e-3, lora_r=2),
        eval=EvalSection(max_tasks=2, min_tasks=2, required=False, max_steps=1, max_tokens=8),
        canary=CanarySection(rounds=1, guardrails=(), mde=0.5), alarms=AlarmSection(rules=()),
    ).for_org("acme")
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    store.create_key("acme", name="acme-ci")  # the org's own key (the loop makes its own for traffic)
    b_key = store.create_key("globex")
    registry.register_checkpoint(store, "b-lora", str(_adapter(tmp_path)), org="globex", version=3,
                                 meta={"base": "tiny"})
    registry.set_experiment(store, "globex-exp", [("control", "tiny", 0.5), ("canary", "b-lora", 0.5)], org="globex")
    b_ids: list[str] = []
    b_served: set[str] = set()
    seen: dict[str, set[str]] = {"collect": set(), "canary": set()}

    def traffic(ctx: TrafficContext) -> None:
        url = ctx.server()
        assert ctx.org == "acme"
        for u in range(6 if ctx.phase == "collect" else 48):
            user = f"a-{u}"
            iid, cp = _ask(url, ctx.api_key, user, f"{ctx.phase}-{user}")
            seen[ctx.phase].add(cp)
            # A's users accept every answer of the candidate and two thirds of production's: it promotes
            good = cp.startswith("t-acme-c") or u % 3 != 0
            assert _feedback(url, ctx.api_key, iid, "accept" if good else "reject") == 200
            if u % 6 == 0:  # org B uses the same server in the same window
                bid, bcp = _ask(url, b_key, f"b-{u}", f"{ctx.phase}-b-{u}")
                b_ids.append(bid)
                b_served.add(bcp)

    rep = run_cycle(cfg, traffic=traffic, progress=False).to_dict()
    cand = registry.get_checkpoint(store, "t-acme-c0001")

    # trained from A's interactions only: an adapter on the shared base
    samples = [json.loads(x) for x in (Path(rep["cycle_dir"]) / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["org_id"] for s in samples} == {"acme"}
    assert not {s["interaction_id"] for s in samples} & set(b_ids) and b_ids
    assert (Path(cand.path) / "adapter_config.json").is_file() and rep["train"]["adapter"] is True
    assert cand.org_id == "acme" and cand.meta["base"] == "tiny" and rep["train"]["base"] == "tiny"
    # gated on A's own held-out tasks (none of them sent as traffic)
    heldout = Path(cfg.root) / "heldout.jsonl"
    assert rep["eval"]["suite"] == str(heldout) and rep["eval"]["tasks"] == 2
    # canaried to A's users only; B's auto never reached it
    assert seen["collect"] == {"tiny"} and seen["canary"] == {"tiny", "t-acme-c0001"}
    assert b_served <= {"tiny", "b-lora"} and "t-acme-c0001" not in b_served
    # promoted for A only: the shared production, B's arm and B's experiment are as they were
    assert rep["decision"] == "promote", rep["reason"]
    assert registry.production(store, "acme").name == "t-acme-c0001"
    assert registry.production(store, None).name == "tiny" and registry.production(store, "globex").name == "tiny"
    assert registry.get_checkpoint(store, "b-lora").state == "canary"
    exp = registry.get_experiment(store, "globex-exp")
    assert exp.status == "active" and [a.checkpoint for a in exp.arms] == ["tiny", "b-lora"]
    assert registry.active_experiment(store, "acme") is None  # A's canary stopped; B's is not A's

    # B's keys cannot see, use or read A's adapter or A's interactions
    from etude.loop.server import running_server

    with running_server(cfg.db_url(), model="tiny") as srv:
        b = openai.OpenAI(base_url=srv.base_url, api_key=b_key, max_retries=0)
        a = openai.OpenAI(base_url=srv.base_url, api_key=store.create_key("acme"), max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        assert "t-acme-c0001" in {m.id for m in a.models.list()}
        assert "t-acme-c0001" not in {m.id for m in b.models.list()}
        with pytest.raises(openai.NotFoundError):
            b.chat.completions.create(model="t-acme-c0001", messages=msgs, max_tokens=2)
        assert a.chat.completions.create(model="t-acme-c0001", messages=msgs, max_tokens=2).model == "t-acme-c0001"
        for u in range(4):  # B's auto after the promotion: never A's adapter
            _, cp = _ask(srv.base_url, b_key, f"b-after-{u}", f"after-{u}")
            assert cp in {"tiny", "b-lora"}
        a_iid = samples[0]["interaction_id"]
        r = httpx.get(f"{srv.base_url}/interactions/{a_iid}", headers={"authorization": f"Bearer {b_key}"})
        assert r.status_code == 404
        assert _feedback(srv.base_url, b_key, a_iid, "accept") == 404


CONFIG = """
[loop]
name = "t"
root = "{root}"
model = "tiny"

[traffic]
kind = "none"
tasks = "builtin:train"
max_tasks = 1

[eval]
max_tasks = 2
min_tasks = 2
"""


@pytest.mark.slow
def test_org_without_a_key_or_without_interactions_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cfg_path = tmp_path / "loop.toml"
    cfg_path.write_text(CONFIG.format(root=root))
    db = LoopConfig.from_toml(cfg_path).db_url()
    store = open_store(db)
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    before = registry_snapshot(db)

    r = loop_cli(cfg_path, "acme")  # no key at all
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["etude: error: organisation 'acme' has no API key: create one with "
                                             "`etude keys create --org acme` (nothing was trained, the registry and "
                                             "the router are unchanged)"]
    assert registry_snapshot(db) == before and not (root / "orgs" / "acme").exists()

    store.create_key("acme", name="ci")  # a key, but no interactions in the window
    r = loop_cli(cfg_path, "acme")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "organisation 'acme' has no interactions in the collection window" in lines[0]
    assert registry_snapshot(db) == before
    assert registry.production(store, "acme").name == "tiny"
