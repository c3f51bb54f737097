"""The Ray executor of `etude eval` (etude.evals.raypool): episodes as Ray tasks, the policy in one
Ray actor, the same files as the thread pool.

Fast: bad executor settings and an unreachable `--ray-address` are one line (exit 2) before
anything is written, without starting Ray. Slow (real isodate tasks, real sandboxes, Ray started
for the run): the oracle and a scripted policy write the same records on Ray as on threads, a
thread-pool run resumes on Ray, a local model answers from the actor, and an eval spread over two
raylets on this machine (`ray start --head` + `ray start --address`) runs episodes on both nodes.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.evals import EvalConfig, run_eval
from etude.types import Task

RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broken_suite(tmp_path: Path) -> Path:
    from etude.tasks import save_tasks

    task = Task(instance_id="local__missing", repo="local/x", base_commit="local", patch="", test_patch="",
                problem_statement="fix it", setup={"repo_dir": str(tmp_path / "no-such-repo")})  # fmt: skip
    save_tasks([task], tmp_path / "suite.jsonl")
    return tmp_path / "suite.jsonl"


def _eval_cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etude.cli", "eval", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def test_bad_executor_settings_are_one_line(tmp_path):
    with pytest.raises(EtudeError, match="executor must be ray or threads"):
        EvalConfig(executor="dask")
    with pytest.raises(EtudeError, match="ray_task_cpus"):
        EvalConfig(ray_task_cpus=0)
    from etude.raycluster import _check_reachable

    with pytest.raises(EtudeError, match="HOST:PORT"):
        _check_reachable("nowhere")
    out = tmp_path / "run"
    proc = _eval_cli("--suite", str(_broken_suite(tmp_path)), "--model", "noop", "--out", str(out),
                     "--executor", "threads", "--ray-address", "127.0.0.1:1")  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == "etude: error: --ray-address needs --executor ray"


def test_unreachable_ray_address_is_one_line_and_exit_2(tmp_path):
    # Regression: ray.init(address=...) on a dead address retried for minutes; now a TCP check
    # answers at once, before Ray starts and before anything is written.
    out, port = tmp_path / "run", _free_port()
    t0 = time.monotonic()
    proc = _eval_cli("--suite", str(_broken_suite(tmp_path)), "--model", "noop", "--out", str(out),
                     "--ray-address", f"127.0.0.1:{port}", timeout=120)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"etude: error: no Ray cluster answers at 127.0.0.1:{port}") and "ray start" in lines[0]
    assert proc.stdout == "" and not (out / "run.json").exists()
    assert time.monotonic() - t0 < 60


# --- slow: real episodes


@pytest.fixture(scope="module")
def suite(isodate_tasks, tmp_path_factory):
    from etude.tasks import save_tasks

    path = tmp_path_factory.mktemp("suite") / "isodate.jsonl"
    save_tasks(isodate_tasks[:2], path)
    return path


def _records(out: Path) -> dict[tuple[str, int], dict]:
    recs = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    return {(r["instance_id"], r["sample"]): r for r in recs}


def _why(recs: dict) -> str:
    """What a failing assertion on episode records prints: each one's status, errors and the tail
    of its grading run (a CI failure of these tests once showed none of it)."""
    def one(r: dict) -> str:
        o = r.get("outcome") or {}
        missing = [t for part in ("fail_to_pass", "pass_to_pass") for t, st in (o.get(part) or {}).items()
                   if st == "missing"]
        return (f"{r.get('instance_id')}#{r.get('sample')}: status={r.get('status')} error={r.get('error')!r} "
                f"grade_error={o.get('error')!r} missing={len(missing)} {missing[:3]} "
                f"duration_s={o.get('duration_s')} log_tail={(o.get('log_tail') or '')[-400:]!r}")
    return "\n".join(one(r) for r in recs.values())


def _stable(rec: dict) -> dict:
    """What two runs of a deterministic policy must agree on: times, pids and nodes vary, and so
    does the reward's efficiency term (it counts the tools' wall time) and with it the total."""
    eff = {k: v for k, v in rec.get("efficiency", {}).items() if k != "wall_s"}
    outcome = rec.get("outcome") or {}
    terms = {k: v for k, v in ((rec.get("reward") or {}).get("terms") or {}).items() if k != "efficiency"}
    return {
        "status": rec["status"], "error": rec.get("error"), "resolved": rec["resolved"], "partial": rec["partial"],
        "resolved_before_flags": rec.get("resolved_before_flags"), "policy_id": rec.get("policy_id"),
        "reward_terms": terms, "flags": rec.get("flags"), "adherence": (rec.get("adherence") or {}).get("score"),
        "diff": rec.get("diff"), "efficiency": eff, "tests": [outcome.get("fail_to_pass"), outcome.get("pass_to_pass")],
    }  # fmt: skip


def _ray_cfg(**kw) -> EvalConfig:
    return EvalConfig(workers=2, progress=False, report=False, **kw)


@pytest.mark.slow
def test_oracle_on_ray_writes_what_threads_write(suite, tmp_path):
    import ray

    a, b = tmp_path / "threads", tmp_path / "ray"
    sa = run_eval(suite, "oracle", a, EvalConfig(workers=2, executor="threads", progress=False, report=False), use="final")
    sb = run_eval(suite, "oracle", b, _ray_cfg(), use="final")
    assert not ray.is_initialized()  # the run started its own Ray and stopped it
    ra, rb = _records(a), _records(b)
    assert set(ra) == set(rb) and len(ra) == 2
    assert all(ra[k]["status"] == "ok" and ra[k]["resolved"] for k in ra), _why(ra)
    assert all(rb[k]["status"] == "ok" and rb[k]["resolved"] for k in rb), _why(rb)
    assert {k: _stable(r) for k, r in ra.items()} == {k: _stable(r) for k, r in rb.items()}, _why(ra) + "\n" + _why(rb)
    assert all("node_id" in r and r["pid"] != os.getpid() for r in rb.values())  # ran in Ray workers
    assert all("node_id" not in r for r in ra.values())
    for r in rb.values():  # the trajectory came back from the worker's node into the run folder
        lines = (b / r["trajectory"]).read_text().splitlines()
        assert lines and len(lines) == len((a / r["trajectory"]).read_text().splitlines())
    assert sa["correctness"] == sb["correctness"] and sa["adherence"]["score"] == sb["adherence"]["score"]
    assert json.loads((b / "run.json").read_text())["config"]["executor"] == "ray"


@pytest.mark.slow
def test_thread_run_resumes_on_ray_and_policy_errors_read_the_same(suite, tmp_path):
    # One real tool call, then the policy raises: the harness must see the policy's own exception
    # through the actor (stop reason "error", "policy failed: RuntimeError: boom"), not Ray's.
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
                                  {"raise": "boom"}]))  # fmt: skip
    model = f"scripted:{script}"
    a = tmp_path / "run"
    run_eval(suite, model, a, EvalConfig(workers=2, executor="threads", progress=False, report=False), use="final")
    first = (a / "results.jsonl").read_text().splitlines()
    s = run_eval(suite, model, a, _ray_cfg(samples=2), use="final")
    lines = (a / "results.jsonl").read_text().splitlines()
    assert lines[: len(first)] == first and len(lines) == 2 * len(first)  # sample 0 untouched, sample 1 added
    assert s["resumed_skipped"] == len(first)
    recs = _records(a)
    for iid in {k[0] for k in recs}:
        t, r = recs[(iid, 0)], recs[(iid, 1)]
        assert "node_id" in r and "node_id" not in t
        assert _stable(t) == _stable(r) and r["efficiency"]["stop_reason"] == "error", _why({0: t, 1: r})
        for rec in (t, r):
            assert "policy failed: RuntimeError: boom" in (a / rec["trajectory"]).read_text()


@pytest.mark.slow
def test_local_model_answers_from_the_policy_actor(suite, tmp_path):
    from etude.harness import HarnessConfig

    s = run_eval(suite, "tiny", tmp_path / "run", _ray_cfg(harness=HarnessConfig(max_steps=1, max_tokens_per_turn=16)), use="final")
    recs = _records(tmp_path / "run")
    assert s["errors"] == 0 and len(recs) == 2
    assert all(r["status"] == "ok" and r["policy_id"] == "tiny" and r["efficiency"]["completion_tokens"] > 0
               for r in recs.values())  # fmt: skip


@pytest.mark.slow
def test_policy_actor_batches_concurrent_turns():
    """Four episodes' turns sent at once to the actor become one forward of the shared model."""
    import ray

    from etude.evals.raypool import ActorPolicy, PolicyServer
    from etude.types import Message

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        server = ray.remote(PolicyServer).options(num_cpus=0, max_concurrency=4).remote("tiny", None, "hf")
        assert ray.get(server.ready.remote()) is None
        task = Task(instance_id="t", repo="r", base_commit="b", patch="", test_patch="", problem_statement="p")
        policies = [ActorPolicy.open(server, task, k) for k in range(4)]
        refs = [server.generate.remote(p.key, [Message(role="user", content=f"hi {i}")], [], 8, 0.7)
                for i, p in enumerate(policies)]  # fmt: skip
        assert all(g.policy_id == "tiny" and len(g.token_ids) > 0 for g in ray.get(refs))
        stats = ray.get(server.stats.remote())
        assert stats["open"] == 4 and stats["jobs"] == 4 and stats["batches"] < 4, stats
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_eval_runs_on_two_raylets_through_ray_address(suite, tmp_path):
    """`ray start --head` and `ray start --address` (one CPU each) on this machine, then `etude eval
    --ray-address`: episodes run on both nodes. The nodes are stopped by the ids of the `ray start
    --block` processes this test started (not `ray stop`, which would stop every Ray on the host)."""
    port = _free_port()
    # NOTE: a short temp dir of our own (Ray's socket paths must stay under ~107 characters), and
    # token auth off: Ray 2.60 enables it on a head that finds ~/.ray/auth_token but not on a
    # worker node, which is then refused.
    temp = Path(tempfile.mkdtemp(prefix="etude-ray-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=1", "--block", "--disable-usage-stats", f"--temp-dir={temp}"]
    nodes: list[subprocess.Popen] = []

    def start(*args: str) -> None:
        log = open(temp / f"node{len(nodes)}.log", "w")  # noqa: SIM115 - closed with the process
        nodes.append(subprocess.Popen([str(RAY), "start", *args, *common], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip

    try:
        start("--head", f"--port={port}", "--include-dashboard=false")
        _wait(lambda: _answers(port), 120, "the head node")
        start(f"--address=127.0.0.1:{port}")
        _wait(lambda: _alive_nodes(port, env) >= 2, 180, "the second node")
        out = tmp_path / "run"
        proc = _eval_cli("--suite", str(suite), "--model", "oracle", "--out", str(out), "--workers", "2",
                         "--samples", "2", "--no-report", "--ray-address", f"127.0.0.1:{port}", env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)  # stdout is the summary alone
        assert summary["episodes"] == 4 and summary["errors"] == 0
        recs = _records(out)
        assert len({r["node_id"] for r in recs.values()}) == 2, [r["node_id"] for r in recs.values()]
        assert all(r["resolved"] for r in recs.values()), _why(recs)
    finally:
        for p in nodes:
            os.killpg(p.pid, signal.SIGTERM)
        for p in nodes:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _alive_nodes(port: int, env: dict) -> int:
    proc = subprocess.run([str(RAY), "status", f"--address=127.0.0.1:{port}"], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip
    active = proc.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return sum(1 for ln in active.splitlines() if "node_" in ln)


def _wait(ready, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up within {timeout_s} s")
        time.sleep(1)


def _square(x: int) -> int:
    if x == 4:
        raise ValueError("four")
    time.sleep(0.05)
    return x * x


@pytest.mark.slow
def test_run_bounded_keeps_the_limit_and_finishes_what_is_in_flight():
    """`raycluster.run_bounded`, the loop under eval episodes and simulated users: never more than
    `limit` in flight, every item finished once; when `finish` raises, the queued items never
    start and those already in flight are still finished."""
    import ray

    from etude.raycluster import connect, ray_get, run_bounded

    started = connect(None, num_cpus=2)
    try:
        task = ray.remote(_square).options(num_cpus=0.25, max_retries=0)
        inflight, peak, seen = set(), [0], {}

        def submit(x):
            inflight.add(x)
            peak[0] = max(peak[0], len(inflight))
            return task.remote(x)

        def finish(x, ref):
            inflight.discard(x)
            try:
                seen[x] = ray_get(ref)
            except ValueError as e:
                seen[x] = str(e)

        run_bounded(list(range(10)), submit, finish, 3)
        assert peak[0] == 3 and seen == {x: ("four" if x == 4 else x * x) for x in range(10)}

        submitted, finished = [], []

        def finish_raising(x, ref):
            finished.append(x)
            ray_get(ref)  # item 4 raises here: the run stops

        with pytest.raises(ValueError, match="four"):
            run_bounded(list(range(10)), lambda x: submitted.append(x) or task.remote(x), finish_raising, 3)
        assert 4 in submitted and len(submitted) < 10  # the queue stopped
        assert sorted(finished) == sorted(submitted)  # everything submitted was finished
    finally:
        if started:
            ray.shutdown()
