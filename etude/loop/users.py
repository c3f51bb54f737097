"""The simulated user population: the traffic of tests, benchmarks and the demo. THESE USERS
ARE SIMULATED, not real people.

```python
from etude.loop.users import UserModel, make_population, run_population
users = make_population(tasks, 40, seed=0)                 # each: one repository, a request stream
records = run_population(base_url, api_key, users, round_key="collect-0", model=UserModel())
```

Each user has one repository (a package of the task curriculum) and a seeded stream of requests
(that repository's tasks). A session runs the real agent client against the real server over
HTTP: `etude.harness` with `etude.policy.openai_http.OpenAIPolicy` (model "auto", the user's id in
the body, a session header) in a fresh copy-on-write workspace of the task's repository with the
task's sandbox (`etude.envs.episode.open_task_episode`), asked the same text as training and
evaluation (`task_request`). Then, per change the agent made (its answer to the request, then to
each follow-up):

1. the simulator grades the workspace once (`etude.envs.grade`, the task's tests in a clean copy)
   and hands the user one bit, correct or not; no user reads a test or the gold patch;
2. the user reacts through noise (`etude.loop.population.UserModel.react`): keeps the change with
   p_keep_good / p_keep_bad (accept), else rejects it and puts the files back as they were before
   it; abandons the session (no explicit verdict, no follow-up) with p_abandon; sends a
   dissatisfied follow-up with p_dissatisfied_good / _bad — a real next request in the same
   session, which the server labels by its rules and which the agent answers (that answer is
   graded and judged the same way, up to max_followups) — or says thanks with p_satisfied_*;
3. accept / reject go to `/v1/feedback` on the change's last interaction (distillation gives the
   verdict to every turn of that change), thanks as a `followup` event with its text;
4. when the session is over the user edits their repository: a Beta-distributed share
   (mean overwrite_good / overwrite_bad) of the lines the agent wrote and the user kept are
   rewritten; after persistence_delay_s the real n-gram survival tracker
   (`etude.feedback.measure_edit_persistence`) measures, per turn that wrote something, how much
   of it survives in the repository, and reports it on that turn's interaction.

What this does not pretend: real users are not Bernoulli draws with two rates, and they react
over minutes to days, not seconds. The loop takes any traffic source; this one exists so whole
cycles can run unattended on one machine with a signal about as weak as production's.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from etude.envs.episode import open_task_episode, task_harness_config, task_request
from etude.envs.grade import grade_patch
from etude.errors import EtudeError
from etude.feedback.client import AgentWrite, edits_from_trajectory, measure_edit_persistence, report_feedback
from etude.harness import HarnessConfig
from etude.loop.population import (
    DISSATISFIED_MESSAGES,
    SATISFIED_MESSAGES,
    Reaction,
    SessionSpec,
    SimUser,
    UserModel,
    make_population,
    repo_of,
    session_rng,
)
from etude.policy.openai_http import OpenAIPolicy
from etude.raycluster import connect, failure, ray_get, ray_module, run_bounded
from etude.types import Task, Trajectory

SCRIPTED_NOTE = "traffic from simulated users (etude.loop.users), not real people"
__all__ = ["SCRIPTED_NOTE", "SimUser", "UserModel", "UserPolicy", "make_population", "repo_of", "run_population",
           "run_scripted_users"]


class UserPolicy(OpenAIPolicy):
    """OpenAIPolicy that names the user in every request (the A/B unit is the user)."""

    def __init__(self, *args: Any, user: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.user = user

    # NOTE: OpenAIPolicy has no public hook for extra body fields; `_create` is where the body
    # becomes a request, so the user id goes in there.
    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        return super()._create({**body, "user": self.user})


def run_population(base_url: str, api_key: str, users: Sequence[SimUser], *, round_key: str = "0",
                   sessions_per_user: int = 1, model: UserModel | None = None, start: int = 0,
                   served_model: str = "auto", max_steps: int = 2, max_tokens: int = 32, temperature: float = 0.7,
                   concurrency: int = 2, progress: bool = False, executor: str = "threads",
                   ray_address: str | None = None, harness: HarnessConfig | None = None) -> list[dict[str, Any]]:
    """Each user runs `sessions_per_user` sessions: requests start + k of their stream. One
    record per session, in the order of `users`; a session that fails is recorded with its error,
    the others go on. `harness`: the client's agent harness (None: a default one with `max_steps`,
    `max_tokens` and `temperature`). `executor`: "threads" (a pool in this process) or "ray" (each session a Ray
    task, `concurrency` at a time; `ray_address` joins a cluster, else a local Ray is started for
    the call; see `_on_ray`)."""
    if executor not in ("threads", "ray"):
        raise EtudeError(f"simulated users run on threads or ray, not {executor!r}")
    um = model or UserModel()
    specs = [SessionSpec(u, u.request(start + k), start + k, session_rng(u, round_key, start + k))
             for u in users for k in range(sessions_per_user)]
    hcfg = harness or HarnessConfig(max_steps=max_steps, max_tokens_per_turn=max_tokens, temperature=temperature,
                                    time_limit_s=300.0)
    run = _Runner(base_url, api_key, served_model, um, hcfg)
    with _bar(progress, len(specs)) as advance:
        if executor == "ray":
            return _on_ray(run, specs, concurrency, ray_address, advance)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            records = []
            for rec in pool.map(run.session, specs):
                records.append(rec)
                advance()
    return records


def _ray_session(run: _Runner, spec: SessionSpec) -> dict[str, Any]:
    """Body of a session's Ray task: the record, with the Ray node that ran it."""
    return {**run.session(spec), "node_id": ray_module().get_runtime_context().get_node_id()}


def _on_ray(run: _Runner, specs: Sequence[SessionSpec], concurrency: int, address: str | None,
            advance: Any) -> list[dict[str, Any]]:
    """Sessions as Ray tasks (0.25 CPU each, spread over the nodes), at most `concurrency` in
    flight (`raycluster.run_bounded`: on Ctrl-C the queued sessions never start, those in flight
    finish). A session whose worker died is recorded with its error, like a session that failed.
    A local Ray started here is shut down when the sessions are done; a Ray this process had
    already joined is left running.
    NOTE: a task talks to `run.base_url` from the node it runs on, so on a cluster the server must
    listen on an address the nodes reach (not loopback), and each node needs the task cache."""
    ray = ray_module()
    started = connect(address)
    try:
        task = ray.remote(_ray_session).options(num_cpus=0.25, max_retries=0, scheduling_strategy="SPREAD")
        run_ref = ray.put(run)
        out: dict[int, dict[str, Any]] = {}

        def finish(i: int, ref: Any) -> None:
            try:
                out[i] = ray_get(ref)
            except Exception as e:  # noqa: BLE001 - a dead worker fails its session, not the round
                out[i] = {**specs[i].extras(), "error": failure(e), "scripted": True, "note": SCRIPTED_NOTE}
            advance()

        run_bounded(range(len(specs)), lambda i: task.remote(run_ref, specs[i]), finish, concurrency)
        return [out[i] for i in sorted(out)]
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def run_scripted_users(base_url: str, api_key: str, tasks: Sequence[Task], *, users: int = 4,
                       sessions_per_user: int = 1, model: str = "auto", seed: int = 0, max_steps: int = 2,
                       max_tokens: int = 32, temperature: float = 0.7, concurrency: int = 2,
                       user_prefix: str = "user", progress: bool = False, user_model: UserModel | None = None,
                       round_key: str = "0", start: int = 0, executor: str = "threads",
                       ray_address: str | None = None) -> list[dict[str, Any]]:
    """`make_population(tasks, users, seed)` then `run_population` (the loop's traffic)."""
    if not tasks:
        raise EtudeError("simulated users need at least one task")
    pop = make_population(tasks, users, seed=seed, model=user_model, prefix=user_prefix)
    return run_population(base_url, api_key, pop, round_key=round_key, sessions_per_user=sessions_per_user,
                          model=user_model, start=start, served_model=model, max_steps=max_steps,
                          max_tokens=max_tokens, temperature=temperature, concurrency=concurrency, progress=progress)


class _Runner:
    def __init__(self, base_url: str, api_key: str, served_model: str, model: UserModel, hcfg: HarnessConfig) -> None:
        self.base_url, self.api_key, self.served_model, self.model, self.hcfg = (
            base_url, api_key, served_model, model, hcfg)

    def session(self, spec: SessionSpec) -> dict[str, Any]:
        sid = f"{spec.user.id}-s{spec.index}-{uuid.uuid4().hex[:8]}"
        try:
            return self._session(spec, sid)
        except Exception as e:  # noqa: BLE001 - one failed session must not stop the others
            return {**spec.extras(), "session": sid, "error": f"{type(e).__name__}: {e}", "scripted": True,
                    "note": SCRIPTED_NOTE}

    def _policy(self, user: str, sid: str) -> UserPolicy:
        return UserPolicy(self.base_url, self.served_model, self.api_key, {"x-etude-session": sid}, user=user,
                          max_retries=1, timeout_s=300.0)

    def _session(self, spec: SessionSpec, sid: str) -> dict[str, Any]:
        t0 = time.monotonic()
        task, rng, um = spec.task, spec.rng, self.model
        policy = self._policy(spec.user.id, sid)
        hcfg = task_harness_config(task, self.hcfg)
        changes: list[dict[str, Any]] = []
        kept_writes: list[AgentWrite] = []
        trajs: list[Trajectory] = []
        with open_task_episode(task) as ep:
            request, history = task_request(task), None
            for attempt in range(um.max_followups + 1):
                before = _snapshot(ep.path)
                traj = ep.run(policy, request, hcfg, task_id=task.instance_id, history=history)
                trajs.append(traj)
                correct = bool(grade_patch(task, ep.diff()).resolved)  # the user's one view of this change
                r = um.react(correct, rng, spec.user.leniency)
                changes.append(self._react(ep.path, traj, r, correct, before, kept_writes, rng))
                if r.followup != "dissatisfied" or attempt == um.max_followups:
                    break
                request, history = rng.choice(DISSATISFIED_MESSAGES), traj.messages
            _overwrite(ep.path, kept_writes, changes, rng, spec.user.id)
            if um.persistence_delay_s:
                time.sleep(um.persistence_delay_s)
            persistence = self._persistence(ep.path, trajs, um.persistence_delay_s)
        first = changes[0]
        served = self._served(trajs[0])
        return {**spec.extras(), "session": sid, "resolved": first["correct"], "accepted": first["kept"],
                "abandoned": any(c["abandoned"] for c in changes), "changes": changes,
                "followups": len(changes) - 1, "persistence": persistence,
                "turns": sum(len(t.turns) for t in trajs), "stop_reason": trajs[-1].stop_reason,
                "latency_s": round(time.monotonic() - t0, 3), "checkpoint": served.get("checkpoint"),
                "arm": served.get("arm"), "interaction_ids": [i for t in trajs for i in _ids(t)],
                "scripted": True, "note": SCRIPTED_NOTE}

    def _react(self, repo: Path, traj: Trajectory, r: Reaction, correct: bool, before: dict[str, bytes],
               kept_writes: list[AgentWrite], rng: Any) -> dict[str, Any]:
        ids = _ids(traj)
        if r.kept:
            kept_writes.extend(edits_from_trajectory(traj))
        else:
            _restore(repo, before)
        last = ids[-1] if ids else None
        if last and not r.abandoned:
            report_feedback(self.base_url, self.api_key, last, "accept" if r.kept else "reject",
                            data={"simulated": True})
            if r.followup == "satisfied":
                report_feedback(self.base_url, self.api_key, last, "followup",
                                data={"text": rng.choice(SATISFIED_MESSAGES)})
        return {"correct": correct, "kept": r.kept, "abandoned": r.abandoned, "followup": r.followup,
                "overwrite_share": round(r.overwrite_share, 4), "interaction_ids": ids}

    def _persistence(self, repo: Path, trajs: Sequence[Trajectory], delay_s: float) -> float | None:
        scores = []
        for traj in trajs:
            for turn in traj.turns:  # each turn's edits are judged on that turn's interaction
                edits = edits_from_trajectory(dataclasses.replace(traj, turns=(turn,)))
                iid = getattr(turn.generation, "response_id", None)
                if not edits or not iid:
                    continue
                rep = measure_edit_persistence(repo, edits)
                report_feedback(self.base_url, self.api_key, iid, "edit_persistence", rep.score,
                                rep.data(delay_s=delay_s))
                scores.append(rep.score)
        return sum(scores) / len(scores) if scores else None

    def _served(self, traj: Trajectory) -> dict[str, Any]:
        ids = _ids(traj)
        if not ids:
            return {}
        r = httpx.get(f"{self.base_url.rstrip('/')}/interactions/{ids[0]}", timeout=30,
                      headers={"authorization": f"Bearer {self.api_key}"})
        return r.json() if r.status_code == 200 else {}


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(root).parts
            and "__pycache__" not in p.parts]


def _snapshot(root: Path) -> dict[str, bytes]:
    """The repository's files before a change, so a rejected change is put back exactly."""
    return {str(p.relative_to(root)): p.read_bytes() for p in _files(root)}


def _restore(root: Path, before: dict[str, bytes]) -> None:
    """The user rejects the change: every file is put back as it was before it."""
    now = {str(p.relative_to(root)) for p in _files(root)}
    for rel in now - set(before):
        (root / rel).unlink(missing_ok=True)
    for rel, data in before.items():
        p = root / rel
        if not p.is_file() or p.read_bytes() != data:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


def _overwrite(root: Path, writes: Sequence[AgentWrite], changes: Sequence[dict[str, Any]], rng: Any, user: str) -> int:
    """The user's own later edits: each kept agent line is rewritten with the session's share
    (the last kept change's, drawn by the UserModel). Returns the lines rewritten."""
    share = next((c["overwrite_share"] for c in reversed(changes) if c["kept"]), 0.0)
    n = 0
    for w in writes:
        p = root / w.path
        if not share or not p.is_file():
            continue
        text = p.read_text(errors="replace")
        for line in {ln for ln in w.text.splitlines() if ln.strip()}:
            if line in text and rng.random() < share:
                indent = line[: len(line) - len(line.lstrip())]
                text = text.replace(line, f"{indent}# {user} rewrote this line ({rng.randrange(10**6)})", 1)
                n += 1
        p.write_text(text)
    return n


def _ids(traj: Trajectory | None) -> list[str]:
    if traj is None:
        return []
    return [i for t in traj.turns if (i := getattr(t.generation, "response_id", None))]


class _bar:
    """A rich progress bar over sessions (or nothing)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda: None
        from rich.progress import Progress

        self.p = Progress(transient=True)
        self.p.start()
        task = self.p.add_task(f"simulated users ({SCRIPTED_NOTE})", total=self.total)
        return lambda: self.p.advance(task)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.p.stop()
