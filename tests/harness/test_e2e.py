"""End to end: the scripted example session on the built-in example repository, in a real
copy-on-write workspace with commands in the real bwrap sandbox; and `etude agent` as a command."""

import json
import shutil
import subprocess
import sys
import threading

import pytest

from etude.harness import HarnessConfig, load_trajectories
from etude.harness import loop as loop_mod
from etude.harness.agent import EXAMPLE_REPO, EXAMPLE_SESSION, run_on_repo
from etude.policy.scripted import ScriptedPolicy, load_script

pytestmark = pytest.mark.slow

FIX = "+    return round(subtotal(items) * (1 - discount), 2)"


@pytest.fixture
def repo(tmp_path):
    dst = tmp_path / "shopcart-repo"
    shutil.copytree(EXAMPLE_REPO, dst, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return dst


def _session():
    data = load_script(EXAMPLE_SESSION)
    return data["request"], ScriptedPolicy(data["outputs"])


def test_example_session_fixes_the_bug_in_a_real_sandbox(repo, tmp_path, monkeypatch):
    # Prove the parallel batches really overlap: the two read-only calls of a turn must meet here.
    real, barrier, threads = loop_mod._call_tool, threading.Barrier(2, timeout=30), set()

    def meet(name, args, ctx):
        if name in ("list_dir", "grep", "read_file"):
            threads.add(threading.current_thread().name)
            barrier.wait()
        return real(name, args, ctx)

    monkeypatch.setattr(loop_mod, "_call_tool", meet)
    before = (repo / "shopcart" / "cart.py").read_text()
    request, pol = _session()
    run = run_on_repo(pol, request, repo, HarnessConfig(), trajectory_path=tmp_path / "t.jsonl")
    t = run.trajectory
    assert t.stop_reason == "answer" and len(t.turns) == 5 and t.broken_calls == 0
    assert [len(turn.tool_executions) for turn in t.turns] == [2, 2, 1, 1, 0]
    assert len(threads) >= 2
    terminal = t.turns[3].tool_executions[0].result
    assert terminal.meta["exit_code"] == 0 and "4 passed" in terminal.output  # pytest ran inside the sandbox
    assert FIX in run.patch and "diff --git a/shopcart/cart.py b/shopcart/cart.py" in run.patch
    assert (repo / "shopcart" / "cart.py").read_text() == before  # without --apply the repo is untouched
    row = load_trajectories(tmp_path / "t.jsonl")[-1]
    assert row["diff"] == run.patch and row["meta"]["complete"] is True


def test_apply_lands_the_patch(repo, tmp_path):
    request, pol = _session()
    run = run_on_repo(pol, request, repo, HarnessConfig(), apply=True, trajectory_path=tmp_path / "t.jsonl")
    assert run.applied and "* (1 - discount)" in (repo / "shopcart" / "cart.py").read_text()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0 and "4 passed" in r.stdout


def _etude(*args, env_home):
    env = {"ETUDE_HOME": str(env_home), "PATH": "/usr/bin:/bin", "HOME": str(env_home)}
    return subprocess.run([sys.executable, "-m", "etude.cli", *args], capture_output=True, text=True, timeout=300, env=env)


def test_etude_agent_example_command(tmp_path):
    r = _etude("agent", "--policy", "scripted", "--example", "--trajectory", str(tmp_path / "t.jsonl"), env_home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("diff --git") and FIX in r.stdout
    assert "steps 5" in r.stderr and "stop: answer" in r.stderr
    assert json.loads((tmp_path / "t.jsonl").read_text())["stop_reason"] == "answer"


def test_etude_agent_script_apply_and_bad_input(repo, tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps(json.loads(EXAMPLE_SESSION.read_text())["outputs"]))
    r = _etude("agent", "fix the discount", "--repo", str(repo), "--policy", "scripted", "--script", str(script), "--apply", env_home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "applied" in r.stderr
    assert "* (1 - discount)" in (repo / "shopcart" / "cart.py").read_text()
    assert list((tmp_path / "trajectories").glob("agent-*.jsonl"))  # default trajectory under ETUDE_HOME
    bad = _etude("agent", "x", "--repo", str(tmp_path / "missing"), "--policy", "scripted", "--script", str(script), env_home=tmp_path)
    assert bad.returncode == 2 and "--repo is not a directory" in bad.stderr and "Traceback" not in bad.stderr
