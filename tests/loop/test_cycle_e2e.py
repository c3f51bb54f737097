"""One full loop cycle on the tiny model, for real: scripted users drive the real `etude serve`
over loopback, the cycle is SIGKILLed in the middle of its eval stage, and `etude loop` run again
resumes it — finished stages are not redone — through canary, readout and the decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etude.store import open_store

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[loop]
name = "t"
root = "{root}"
org = "acme"
model = "tiny"

[traffic]
users = 4
tasks = "builtin:train"
max_tasks = 2
max_steps = 1
max_tokens = 16
concurrency = 2

[train]
steps = 1
batch_size = 4

[eval]
max_tasks = 1
min_tasks = 1  # below the gate's minimum on purpose: the gate is inconclusive, the canary still runs
on_inconclusive = "canary"
max_steps = 1
max_tokens = 16

[canary]
rounds = 1
"""


def _loop(cfg: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "etude.cli", "loop", "--config", str(cfg), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=ROOT, **kw)


def _state(root: Path) -> dict | None:
    p = root / "cycle-0001" / "state.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _kill_when_running(proc: subprocess.Popen, root: Path, stage: str, timeout_s: float = 900) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = _state(root)
        if st and st["stages"][stage]["status"] == "running":
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return _state(root)
        if proc.poll() is not None:
            raise AssertionError(f"loop ended before {stage} ran: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{stage} never started")


def _servers_of(db_path: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(db_path) in cmd and "serve" in cmd:
                pids.append(int(p.name))
    return pids


@pytest.mark.slow
def test_full_cycle_killed_mid_eval_resumes_without_redoing_stages(tmp_path: Path) -> None:
    root = tmp_path / "loop"
    cfg = tmp_path / "loop.toml"
    cfg.write_text(CONFIG.format(root=root))
    before = _kill_when_running(_loop(cfg), root, "eval")
    assert [before["stages"][s]["status"] for s in ("collect", "distill", "train")] == ["done"] * 3
    time.sleep(1.0)
    assert _servers_of(root / "etude.db") == []  # the server died with the killed loop

    proc = _loop(cfg)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out)
    after = _state(root)
    st = after["stages"]

    # finished stages were not redone; the interrupted one was, once
    for name in ("collect", "distill", "train"):
        assert st[name]["attempts"] == 1 and st[name]["started_at"] == before["stages"][name]["started_at"]
    assert st["eval"]["attempts"] == 2 and st["eval"]["status"] == "done"
    assert after["finished"] and report["finished"]
    assert all(st[s]["status"] == "done" for s in ("register", "canary", "readout", "decide"))
    assert all(isinstance(report["stages"][s]["wall_s"], float) for s in report["stages"])

    # collect -> distill: every interaction of the window became a sample, with scripted users
    c = report["collect"]
    # ... run as Ray tasks (the default executor of scripted traffic) on this machine's one raylet
    assert c["sessions"] == {"sessions": 4, "errors": 0, "resolved": c["sessions"]["resolved"], "users": 4,
                             "scripted": True, "first_error": None, "ray_nodes": 1}
    assert c["interactions"] >= 4 and report["distill"]["samples"] == c["interactions"]
    assert report["train"]["steps"] == 1 and Path(report["train"]["checkpoint"], "model.safetensors").is_file()
    assert report["eval"]["tasks"] == 1 and isinstance(report["eval"]["gate_passed"], bool)

    store = open_store(f"sqlite:///{root / 'etude.db'}")
    window = store.interactions(org="acme", since=c["since"], until=c["until"])
    assert len(window) == c["interactions"] and {r["arm"] for r in window} == {None}
    # canary: both arms served, read back per user, and the decision applied to the registry
    canary = store.interactions(org="acme", experiment_id="t-canary-c0001")
    assert {r["checkpoint"] for r in canary} == {"tiny", "t-c0001"}
    assert report["ab"]["users"] == {"control": 2, "treatment": 2}
    verdicts = store.feedback(org="acme", kind="accept") + store.feedback(org="acme", kind="reject")
    # every simulated session's change is judged once (4 collect + 4 canary); a follow-up's answer
    # is judged too, so there may be more verdicts than sessions (etude.loop.population)
    by_id = {r["id"]: r for r in window + canary}
    judged = {by_id[v["interaction_id"]]["session_id"] for v in verdicts if v["interaction_id"] in by_id}
    assert len(verdicts) >= 8 and len(judged) == 8
    labelled = [f for f in store.feedback(org="acme", kind="followup") if f["source"] == "server"]
    assert all(f["data"].get("label") for f in labelled)  # the server labels every follow-up it receives

    from etude.serve import registry

    cand = registry.get_checkpoint(store, "t-c0001")
    # one eval task: the gate is inconclusive, so whatever the readout says the cycle does not promote
    assert report["eval"]["gate"] == "inconclusive" and report["decision"] == "rollback"
    assert "eval gate" in report["reason"] and "inconclusive on 1 task(s)" in report["reason"]
    assert cand.state == "retired" and report["production_after"]["name"] == "tiny"
    assert registry.get_experiment(store, "t-canary-c0001").status == "stopped"
    assert _servers_of(root / "etude.db") == []

    # a third run starts cycle 2 rather than touching the finished cycle 1
    assert json.loads((root / "cycle-0001" / "report.json").read_text())["decision"] == report["decision"]
