"""Scripted users: the traffic of tests, benchmarks and the demo. THESE USERS ARE SCRIPTED.

Each session of each user runs the real agent client against the real server over HTTP:
`etude.harness.run_agent` with `etude.policy.openai_http.OpenAIPolicy` (model "auto", the
user's id in the body, a session header), in the episode training and evaluation use
(`etude.envs.episode.open_task_episode`: a fresh copy-on-write workspace of the task's
repository with the task's sandbox). Then the user behaves by a fixed script:

1. grades the agent's patch with the task's hidden tests in a clean copy (`etude.envs.grade`);
2. keeps the edits if the tests pass, reverts them otherwise (the workspace is the user's repo);
3. reports what a real client would: edit persistence of every turn that wrote something
   (measured on the repository after keeping / reverting), and accept or reject of the session,
   through the real `/v1/feedback` endpoint (`etude.feedback.client`);
4. when the tests still fail, sends a dissatisfied follow-up ("It still fails ...") as a
   second request in the same session; the server labels it from its own rules.

What this does not pretend: real users are not this consistent, do not grade with hidden tests,
and do not react within a second. The loop takes any traffic source; this one exists so a
whole cycle can run unattended on one machine.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from etude.envs.episode import open_task_episode, task_harness_config, task_request
from etude.policy.openai_http import OpenAIPolicy
from etude.types import Task, Trajectory

SCRIPTED_NOTE = "traffic from scripted users (etude.loop.users), not real people"
FOLLOWUP = "It still fails: the tests do not pass with your change. Please fix it properly."


class UserPolicy(OpenAIPolicy):
    """OpenAIPolicy that names the user in every request (the A/B unit is the user)."""

    def __init__(self, *args: Any, user: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.user = user

    # NOTE: OpenAIPolicy has no public hook for extra body fields; `_create` is where the body
    # becomes a request, so the user id goes in there.
    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        return super()._create({**body, "user": self.user})


def run_scripted_users(base_url: str, api_key: str, tasks: Sequence[Task], *, users: int = 4,
                       sessions_per_user: int = 1, model: str = "auto", seed: int = 0, max_steps: int = 2,
                       max_tokens: int = 32, temperature: float = 0.7, concurrency: int = 2,
                       user_prefix: str = "user", progress: bool = False) -> list[dict[str, Any]]:
    """Run users × sessions scripted sessions; one record per session (see module docstring)."""
    if not tasks:
        from etude.errors import EtudeError

        raise EtudeError("scripted users need at least one task")
    rng = random.Random(seed)
    jobs = [(f"{user_prefix}-{u:03d}", s, tasks[rng.randrange(len(tasks))])
            for u in range(users) for s in range(sessions_per_user)]
    run = _Runner(base_url, api_key, model, max_steps, max_tokens, temperature, seed)
    with _bar(progress, len(jobs)) as advance, ThreadPoolExecutor(max_workers=concurrency) as pool:
        records = []
        for rec in pool.map(run.session, jobs):
            records.append(rec)
            advance()
    return records


class _Runner:
    def __init__(self, base_url: str, api_key: str, model: str, max_steps: int, max_tokens: int,
                 temperature: float, seed: int) -> None:
        from etude.harness import HarnessConfig

        self.base_url, self.api_key, self.model, self.seed = base_url, api_key, model, seed
        self.hcfg = HarnessConfig(max_steps=max_steps, max_tokens_per_turn=max_tokens, temperature=temperature,
                                  time_limit_s=300.0)

    def session(self, job: tuple[str, int, Task]) -> dict[str, Any]:
        user, k, task = job
        sid = f"{user}-s{k}-{uuid.uuid4().hex[:8]}"
        try:
            return self._session(user, sid, task)
        except Exception as e:  # noqa: BLE001 - one failed session must not stop the others
            return {"user": user, "session": sid, "task": task.instance_id, "error": f"{type(e).__name__}: {e}",
                    "scripted": True, "note": SCRIPTED_NOTE}

    def _policy(self, user: str, sid: str) -> UserPolicy:
        return UserPolicy(self.base_url, self.model, self.api_key, {"x-etude-session": sid}, user=user,
                          max_retries=1, timeout_s=300.0)

    def _session(self, user: str, sid: str, task: Task) -> dict[str, Any]:
        t0 = time.monotonic()
        policy = self._policy(user, sid)
        hcfg = task_harness_config(task, self.hcfg)
        # the one episode builder, as in training and evaluation (same workspace, sandbox, request)
        with open_task_episode(task) as ep:
            traj = ep.run(policy, task_request(task), hcfg)
            outcome = _grade(task, traj.diff)
            if not outcome.resolved and traj.diff:
                _revert(ep.path, ep.workspace.template, traj.diff)
            fb = self._feedback(ep.path, traj, sid, outcome.resolved)
            follow = None
            if not outcome.resolved:
                follow = ep.run(policy, FOLLOWUP, hcfg.replace(max_steps=1), history=traj.messages)
        served = self._served(traj)
        return {"user": user, "session": sid, "task": task.instance_id, "resolved": outcome.resolved,
                "persistence": fb.get("persistence"), "reverted": fb.get("reverted"), "accepted": outcome.resolved,
                "followup": follow is not None, "turns": len(traj.turns), "stop_reason": traj.stop_reason,
                "latency_s": round(time.monotonic() - t0, 3), "checkpoint": served.get("checkpoint"),
                "arm": served.get("arm"), "interaction_ids": _ids(traj) + (_ids(follow) if follow else []),
                "scripted": True, "note": SCRIPTED_NOTE}

    def _feedback(self, repo: Any, traj: Trajectory, sid: str, resolved: bool) -> dict[str, Any]:
        import dataclasses

        from etude.feedback.client import edits_from_trajectory, measure_edit_persistence, report_feedback

        scores, reverted = [], False
        for turn in traj.turns:  # credit each edit to the generation that made it
            edits = edits_from_trajectory(dataclasses.replace(traj, turns=(turn,)))
            iid = getattr(turn.generation, "response_id", None)
            if not edits or not iid:
                continue
            rep = measure_edit_persistence(repo, edits)
            report_feedback(self.base_url, self.api_key, iid, "edit_persistence", rep.score, rep.data(delay_s=0.0))
            scores.append(rep.score)
            reverted = reverted or rep.reverted
        last = next((i for i in reversed(_ids(traj))), None)
        if last:
            report_feedback(self.base_url, self.api_key, last, "accept" if resolved else "reject",
                            data={"scripted": True})
        return {"persistence": sum(scores) / len(scores) if scores else None, "reverted": reverted}

    def _served(self, traj: Trajectory) -> dict[str, Any]:
        import httpx

        ids = _ids(traj)
        if not ids:
            return {}
        r = httpx.get(f"{self.base_url.rstrip('/')}/interactions/{ids[0]}", timeout=30,
                      headers={"authorization": f"Bearer {self.api_key}"})
        return r.json() if r.status_code == 200 else {}


def _grade(task: Task, diff: str) -> Any:
    from etude.envs.grade import grade_patch

    return grade_patch(task, diff)


def _revert(repo: Any, template: Any, diff: str) -> None:
    """The user throws the agent's change away: every file it touched is put back as it was."""
    import shutil
    from pathlib import Path

    from etude.tasks.diffs import changed_paths

    for rel in changed_paths(diff):
        src, dst = Path(template) / rel, Path(repo) / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        elif dst.is_file():
            dst.unlink()


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
        task = self.p.add_task(f"scripted users ({SCRIPTED_NOTE})", total=self.total)
        return lambda: self.p.advance(task)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.p.stop()
