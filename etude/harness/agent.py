"""`etude agent`: the harness on a user's repository, in a copy-on-write workspace and a sandbox.

The repository itself is never touched while the agent runs: the agent works in
`etude.sandbox.Workspace.create(repo)`, commands run in the bwrap sandbox (or the loudly named
"unsandboxed" backend when asked), and the result is a unified patch. With `apply=True` the
patch is checked with `git apply --check` and only then applied, so it lands whole or not at all.
Not guaranteed: if the repository changes while the agent runs, the patch may no longer apply
(you get a clear error and the patch is kept in the trajectory file).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from etude.errors import EtudeError
from etude.harness.config import HarnessConfig
from etude.harness.loop import run_agent
from etude.paths import home
from etude.protocols import Policy, ToolContext
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
) -> AgentRun:
    """One agent episode on `repo`; returns the trajectory and the patch (applied if asked)."""
    from etude.sandbox import Workspace, make_sandbox

    repo = _check_repo(repo)
    path = trajectory_path or default_trajectory_path()
    with Workspace.create(repo) as ws:
        sandbox = make_sandbox(ws.path, sandbox_config(sandbox_backend))
        ctx = ToolContext(workspace=ws.path, sandbox=sandbox)
        traj = run_agent(policy, request, ctx, config, trajectory_path=path, diff_fn=ws.diff, on_turn=on_turn)
    applied = False
    if apply and traj.diff:
        apply_patch(repo, traj.diff)
        applied = True
    return AgentRun(trajectory=traj, patch=traj.diff, trajectory_path=path, applied=applied)


def sandbox_config(backend: str = "bwrap"):  # -> etude.sandbox.SandboxConfig (imported lazily)
    """The sandbox for agent commands: our virtual environment (pytest and friends) bound
    read-only and first on PATH, so `python -m pytest` works inside."""
    from etude.sandbox import SandboxConfig

    venv = Path(sys.prefix)
    binds = (str(venv),) if sys.prefix != sys.base_prefix else ()
    prepend = (str(venv / "bin"),) if binds else ()
    return SandboxConfig(backend=backend, ro_binds=binds, path_prepend=prepend)  # type: ignore[arg-type]


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


def summary(run: AgentRun) -> str:
    t = run.trajectory
    calls = len(t.tool_calls)
    files = run.patch.count("\ndiff --git ") + run.patch.startswith("diff --git ")
    lines = [
        f"steps {len(t.turns)} · tool calls {calls} (broken {t.broken_calls}) · stop: {t.stop_reason}",
        f"tokens: prompt {t.prompt_tokens}, completion {t.completion_tokens} ({t.meta.get('token_counts')}) · {t.wall_s:.1f} s",
        f"patch: {files} file(s){' applied' if run.applied else ''} · trajectory: {run.trajectory_path}",
    ]
    if t.meta.get("error"):
        lines.append(f"error: {t.meta['error']}")
    return "\n".join(lines)
