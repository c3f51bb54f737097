"""`etude agent`: the harness on a user's repository, in a copy-on-write workspace and a sandbox.

The repository itself is never touched while the agent runs: the episode builder
(`etude.harness.episode.open_episode`) gives the agent a copy-on-write workspace of it, commands
run in the bwrap sandbox (or the loudly named "unsandboxed" backend when asked), and the result
is a unified patch. With `apply=True` the
patch is checked with `git apply --check` and only then applied, so it lands whole or not at all.
Not guaranteed: if the repository changes while the agent runs, the patch may no longer apply
(you get a clear error and the patch is kept in the trajectory file).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.feedback.client import edits_from_trajectory, measure_edit_persistence, report_feedback
from etude.harness.config import HarnessConfig
from etude.harness.episode import open_episode
from etude.harness.record import load_trajectory
from etude.paths import home
from etude.protocols import Policy
from etude.sandbox import SandboxConfig
from etude.types import Trajectory, Turn

DATA = Path(__file__).resolve().parent.parent / "data"
EXAMPLE_REPO = DATA / "example_repo"
EXAMPLE_SESSION = DATA / "example_session.json"


@dataclass(frozen=True)
class AgentRun:
    trajectory: Trajectory
    patch: str
    trajectory_path: Path
    applied: bool = False


def run_on_repo(
    policy: Policy,
    request: str,
    repo: Path,
    config: HarnessConfig,
    *,
    apply: bool = False,
    trajectory_path: Path | None = None,
    sandbox_backend: str = "bwrap",
    on_turn: Callable[[Turn], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> AgentRun:
    """One agent episode on `repo`; returns the trajectory and the patch (applied if asked).
    `meta` goes into the trajectory (the CLI records the repo, server and session there)."""
    repo = _check_repo(repo)
    path = trajectory_path or default_trajectory_path()
    with open_episode(repo, repo_sandbox_config(sandbox_backend)) as ep:
        traj = ep.run(policy, request, config, trajectory_path=path, on_turn=on_turn,
                      meta={"repo": str(repo), **(meta or {})})
    applied = False
    if apply and traj.diff:
        apply_patch(repo, traj.diff)
        applied = True
    return AgentRun(trajectory=traj, patch=traj.diff, trajectory_path=path, applied=applied)


def repo_sandbox_config(backend: str = "bwrap") -> SandboxConfig:
    """The sandbox for agent commands on a user's repository: our virtual environment (pytest
    and friends) bound read-only and first on PATH, so `python -m pytest` works inside."""
    cfg = SandboxConfig(backend=backend)  # type: ignore[arg-type]
    return cfg.with_venv(sys.prefix) if sys.prefix != sys.base_prefix else cfg


def apply_patch(repo: Path, patch: str) -> None:
    """`git apply` the patch in `repo`, all or nothing. Git must not pick up a repository that
    merely encloses `repo` (paths would then be read from its root), hence the ceiling."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(repo.resolve().parent))
    for args in (["git", "apply", "--check", "-"], ["git", "apply", "-"]):
        res = subprocess.run(args, cwd=repo, input=patch, text=True, capture_output=True, env=env, check=False)
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or ["unknown error"])[0]
            raise EtudeError(f"the patch does not apply to {repo}: {why}")


def default_trajectory_path() -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return home() / "trajectories" / f"agent-{stamp}-{os.getpid()}.jsonl"


def _check_repo(repo: Path) -> Path:
    repo = Path(repo).expanduser()
    if not repo.is_dir():
        raise EtudeError(f"--repo is not a directory: {repo}")
    return repo.resolve()


def edit_feedback(trajectory_path: Path, repo: Path | None = None, *, base_url: str | None = None,
                  api_key: str | None = None, send: bool = True) -> dict[str, Any]:
    """How much of what the agent wrote (its successful edit_file/write_file calls) is still in
    the repository now. With a server, each turn that wrote something gets its own
    `edit_persistence` event on that turn's interaction (the response id), so credit goes to the
    generation that made the edit; without ids, on the recorded session.
    -> {"score", "reverted", "per_file", "ranges", "delay_s", "reported": [events]}."""
    traj = load_trajectory(trajectory_path)
    repo = _check_repo(repo or Path(traj.meta.get("repo") or "."))
    delay = round(time.time() - Path(trajectory_path).stat().st_mtime, 1)  # last written when the episode ended
    report = measure_edit_persistence(repo, edits_from_trajectory(traj))
    out: dict[str, Any] = {"score": report.score, **report.data(delay), "reported": []}
    base_url = base_url or traj.meta.get("base_url")
    if send and base_url:
        out["reported"] = _report_per_turn(traj, repo, base_url, api_key or "none", delay)
    return out


def _report_per_turn(traj: Trajectory, repo: Path, base_url: str, api_key: str, delay: float) -> list[dict[str, Any]]:
    sid = traj.meta.get("session_id")
    events = []
    for turn in traj.turns:
        edits = edits_from_trajectory(dataclasses.replace(traj, turns=(turn,)))
        if not edits:
            continue
        iid = getattr(turn.generation, "response_id", None)
        if not iid and not sid:
            raise EtudeError("the trajectory names no interaction or session to attach feedback to")
        rep = measure_edit_persistence(repo, edits)
        events.append(report_feedback(base_url, api_key, iid, "edit_persistence", rep.score, rep.data(delay),
                                      session_id=None if iid else sid))
    return events


def summary(run: AgentRun) -> str:
    t = run.trajectory
    calls = len(t.tool_calls)
    files = run.patch.count("\ndiff --git ") + run.patch.startswith("diff --git ")
    lines = [
        f"steps {len(t.turns)} · tool calls {calls} (broken {t.broken_calls}) · stop: {t.stop_reason}",
        f"tokens: prompt {t.prompt_tokens}, completion {t.completion_tokens} ({t.meta.get('token_counts')}) · {t.wall_s:.1f} s",
        f"patch: {files} file(s){' applied' if run.applied else ''} · trajectory: {run.trajectory_path}",
    ]
    if t.meta.get("session_id"):
        lines.append(f"session: {t.meta['session_id']} (later: etude agent-feedback --trajectory {run.trajectory_path})")
    if t.meta.get("error"):
        lines.append(f"error: {t.meta['error']}")
    return "\n".join(lines)
