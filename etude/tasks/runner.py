"""Running a task's tests with pytest inside the sandbox and reading per-test results.

We run `python -m pytest -v -rfE --continue-on-collection-errors -o addopts=` with no plugins of
ours (pytest's cache disabled and no bytecode written, so the workspace stays clean; the package's
own addopts are dropped because they often name plugins we do not install, such as pytest-cov) and read the verbose progress lines ("NODEID STATUS [ NN%]"), which name
every test, skipped ones included; the short summary adds each failure's message. When a test
reports twice (passed, then an error at teardown) the worse status wins. A test we asked for that
never reports (collection error, crash) is "missing". What this does not guarantee: exact ids for
tests whose parametrize ids contain newlines, or results of tests that print over pytest's own
progress line with capturing disabled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from etude.sandbox import SandboxConfig, run
from etude.types import Task

_RANK = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 2, "failed": 3, "error": 4}
_VERBOSE = re.compile(r"^(?P<id>\S.*?) (?P<st>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*?\))?\s+\[\s*\d+%\]\s*$")
_SUMMARY = re.compile(r"^(?P<st>FAILED|ERROR) (?P<id>\S+?(?:\[.*?\])?)(?: - (?P<msg>.*))?$")
_STATUS = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "xfailed",
    "XPASS": "xpassed",
}
PYTEST_ARGS = (
    "-v",
    "-rfE",
    "-p",
    "no:cacheprovider",
    "--continue-on-collection-errors",
    "--tb=short",
    "--color=no",
    "-o",
    "addopts=",
    "--rootdir=/workspace",
)


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # not a test class, whatever pytest thinks of the name

    status: dict[str, str]  # node id -> passed | failed | error | skipped | xfailed | xpassed
    messages: dict[str, str] = field(default_factory=dict)  # node id -> one-line failure message
    returncode: int = 0
    timed_out: bool = False
    wall_s: float = 0.0
    log_tail: str = ""

    def passed(self) -> set[str]:
        return {t for t, s in self.status.items() if s == "passed"}

    def failed(self) -> set[str]:
        return {t for t, s in self.status.items() if s in ("failed", "error")}


def _merge(status: dict[str, str], tid: str, st: str) -> None:
    if tid not in status or _RANK[st] > _RANK[status[tid]]:
        status[tid] = st


def parse_pytest_output(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Per-test statuses and failure messages from `pytest -v -rfE` output."""
    status: dict[str, str] = {}
    messages: dict[str, str] = {}
    in_summary = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if "short test summary info" in line:
            in_summary = True
            continue
        m = _VERBOSE.match(line)
        if m and "::" in m.group("id") and not in_summary:
            _merge(status, m.group("id"), _STATUS[m.group("st")])
            continue
        s = _SUMMARY.match(line) if in_summary else None
        if s:
            tid = s.group("id")
            if "::" in tid:
                _merge(status, tid, _STATUS[s.group("st")])
            if s.group("msg"):
                messages.setdefault(tid, s.group("msg")[:500])
    return status, messages


def task_sandbox_config(task: Task, venv: Path, timeout_s: float | None = None) -> SandboxConfig:
    """The sandbox a task's commands run in: its test venv, PYTHONPATH at the package root, the
    task's timeout (or `timeout_s`). Grading runs its tests in it; an agent's episode too (as a
    session sandbox, etude.envs.episode)."""
    root = task.setup.get("pythonpath", ".")
    pypath = "/workspace" if root in (".", "") else f"/workspace/{root}"
    env = {"PYTHONPATH": pypath, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "COLUMNS": "300"}
    return SandboxConfig(timeout_s=float(timeout_s or task.timeout_s), env=env).with_venv(venv)


def files_of(test_ids: Sequence[str]) -> list[str]:
    """The test files that hold these node ids (what we pass to pytest)."""
    return sorted({t.split("::", 1)[0] for t in test_ids})


def run_tests(
    workspace: Path, task: Task, venv: Path, targets: Sequence[str] | None = None, timeout_s: float | None = None
) -> TestRun:
    """Run pytest on `targets` (files or dirs; default the task's test paths) in the sandbox."""
    paths = list(targets) if targets else list(task.setup.get("test_paths") or [])
    argv = ["python", "-m", "pytest", *PYTEST_ARGS, *paths]
    res = run(argv, workspace=workspace, config=task_sandbox_config(task, venv, timeout_s))
    out = res.stdout + ("\n" + res.stderr if res.stderr else "")
    status, messages = parse_pytest_output(res.stdout)
    return TestRun(status, messages, res.returncode, res.timed_out, res.wall_s, out[-4000:])


def statuses_for(run_: TestRun, ids: Sequence[str]) -> dict[str, str]:
    """Status of each requested id, "missing" when the run never reported it."""
    return {t: run_.status.get(t, "missing") for t in ids}
