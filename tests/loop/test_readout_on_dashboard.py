"""`etude serve`'s /dashboard shows the A/B readout of an org's running canary with no extra flag
(issue 32 item 5): the loop records each readout it decides on in the store, and the real
`etude serve` subprocess on loopback (started by the cycle itself, tiny model, real SQLite store)
renders it — the interval, the planned users per arm, the users so far — to that org's key only.

Regression: the page showed a readout only when the server was built in-process with a loop
config; `etude serve` said "started without a readout function" for every loop experiment."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from etude.loop import LoopConfig, TrafficContext, run_cycle
from etude.loop.config import CanarySection, TrafficConfig
from etude.loop.state import CycleState
from etude.serve import registry
from etude.store import open_store

USERS = 12  # per canary round


def _users(ctx: TrafficContext) -> None:
    """One request per user, accepted or rejected: the canary's per-user rows."""
    v1 = ctx.server()
    head = {"Authorization": f"Bearer {ctx.api_key}"}
    for u in range(USERS):
        r = httpx.post(f"{v1}/chat/completions", headers=head, timeout=120,
                       json={"model": "auto", "user": f"user-{u}", "max_tokens": 4,
                             "messages": [{"role": "user", "content": f"fix bug {ctx.round}"}]})
        assert r.status_code == 200, r.text
        kind = "accept" if (u + ctx.round) % 3 else "reject"
        assert httpx.post(f"{v1}/feedback", headers=head, timeout=30,
                          json={"interaction_id": r.json()["id"], "kind": kind}).status_code == 200


def test_etude_serve_shows_the_loops_readout_with_its_plan_to_the_orgs_key_only(tmp_path: Path) -> None:
    canary = CanarySection(mde=0.5, user_cv=1.0, rounds=2, min_rounds=2)
    cfg = LoopConfig(root=str(tmp_path / "root"), org="acme", model="tiny", name="t",
                     traffic=TrafficConfig(kind="none"), canary=canary)
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    registry.register_checkpoint(store, "t-c0001", "tiny", version=1, parent="tiny")  # an A/A candidate
    keys = {"acme": store.create_key("acme", name="viewer"), "globex": store.create_key("globex", name="viewer")}
    st = CycleState.load_or_create(tmp_path / "root" / "cycle-0001", 1, cfg.to_dict())
    st.data["production"] = {"name": "tiny", "path": "tiny", "version": 0}
    for name in ("collect", "distill", "train", "eval", "register"):  # resumed at the canary
        st.start(name)
        st.finish(name)
    st.progress("register", checkpoint={"name": "t-c0001", "path": "tiny", "version": 1})
    st.progress("eval", verdict={"gate": "passed", "gate_passed": True, "regressions": [], "inconclusive": [],
                                 "improvements": [], "tasks": 30})
    pages: dict[str, dict[str, str]] = {}

    def traffic(ctx: TrafficContext) -> None:
        base = ctx.server().removesuffix("/v1")  # the real `etude serve` the cycle started
        pages[f"before round {ctx.round}"] = {who: httpx.get(f"{base}/dashboard", timeout=30,
                                                             headers={"Authorization": f"Bearer {k}"}).text
                                              for who, k in keys.items()}
        _users(ctx)

    rep = run_cycle(cfg, traffic=traffic, progress=False).to_dict()
    plan = canary.plan()
    planned = f"{plan.users_per_arm[0]} / {plan.users_per_arm[1]} users per arm"

    start = pages["before round 0"]["acme"]  # the plan is there before the first user
    assert "Recorded by the loop (cycle 1) when the canary started" in start
    assert f"Planned {planned} for a 50.0% lift" in start and "No readout yet" in start

    page = pages["before round 1"]["acme"]  # round 1's readout, as the loop decided on it
    assert "after canary round 1 of 2" in page and "Interim decision: keep collecting — min_rounds not reached" in page
    assert f"planned {planned}" in page
    m = re.search(r"Users: control (\d+), treatment (\d+)", page)
    assert m and int(m.group(1)) + int(m.group(2)) == USERS and min(int(m.group(1)), int(m.group(2))) > 0
    assert "accept_rate (primary)" in page and "always-valid interval" in page
    assert re.search(r"\[[+-]\d+\.\d%, [+-]\d+\.\d%\]", page)  # an interval was rendered
    assert "t-canary-c0001" in page and "Hack alarms" in page
    for other in pages.values():  # another org's key never sees acme's experiment or readout
        assert "t-canary-c0001" not in other["globex"] and "Recorded by the loop" not in other["globex"]

    assert rep["canary"]["rounds"] == 2  # the cycle itself ran on; its last readout is the last recorded
    last = registry.latest_readout(store, "t-canary-c0001")["readout"]
    assert last["round"] == 2 and last["ab"]["users"] == rep["ab"]["users"]
