"""The client side of feedback: measure edit persistence in a repository on disk and report
signals to a server's `/v1/feedback`. `etude agent` (or any integration) calls these.

```python
edits = edits_from_trajectory(traj)                       # what the agent wrote, per file
report = measure_edit_persistence(repo_dir, edits)        # later: how much of it is still there
report_feedback(base_url, key, interaction_id=iid, kind="edit_persistence",
                value=report.score, data=report.data())
```

An interaction is named by `interaction_id` (the response `id` / `x-etude-interaction-id`), or by
`session_id` (the `x-etude-session` the client sent): the server then attaches the event to the
newest interaction of that session. Not guaranteed: persistence is measured on the working tree
as it is when called; the caller chooses the delay (editSurvivalTracker-style trackers measure
at 30 s, 2, 5, 10 and 15 min).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.feedback.signals import AgentEdit, edit_survival
from etude.types import Trajectory


@dataclass(frozen=True)
class AgentWrite:
    """One range the agent wrote into `path` (relative to the repository), and what it replaced."""

    path: str
    text: str
    replaced: str = ""


@dataclass(frozen=True)
class PersistenceReport:
    score: float  # length-weighted share of the agent's text still present, in [0, 1]
    reverted: bool  # most of the agent's text is gone and what it replaced is back
    per_file: dict[str, float] = field(default_factory=dict)
    ranges: int = 0

    def data(self, delay_s: float | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"reverted": self.reverted, "per_file": self.per_file, "ranges": self.ranges}
        if delay_s is not None:
            d["delay_s"] = delay_s
        return d


def edits_from_trajectory(traj: Trajectory) -> list[AgentWrite]:
    """Successful write_file / edit_file calls of an episode, in order."""
    out = []
    for ex in traj.tool_calls:
        if not ex.result.ok:
            continue
        a = ex.call.arguments
        if ex.call.name == "write_file" and isinstance(a.get("content"), str):
            out.append(AgentWrite(str(a.get("path", "")), a["content"]))
        elif ex.call.name == "edit_file" and isinstance(a.get("new_str"), str):
            out.append(AgentWrite(str(a.get("path", "")), a["new_str"], str(a.get("old_str", ""))))
    return [w for w in out if w.path]


def measure_edit_persistence(repo: str | Path, edits: Sequence[AgentWrite]) -> PersistenceReport:
    """Compare each written range with the file as it is now (a deleted file counts as empty)."""
    root = Path(repo)
    by_file: dict[str, list[AgentEdit]] = {}
    for w in edits:
        by_file.setdefault(w.path, []).append(AgentEdit(w.text, w.replaced))
    per_file, weighted, total, reverted_weight = {}, 0.0, 0, 0
    for path, ranges in by_file.items():
        later = _read(root / path)
        surv = edit_survival(ranges, later)
        weight = sum(max(1, len(r.text)) for r in ranges)
        per_file[path] = surv.score
        weighted += surv.score * weight
        total += weight
        reverted_weight += weight if surv.reverted else 0
    score = weighted / total if total else 1.0
    return PersistenceReport(score=score, reverted=total > 0 and reverted_weight * 2 > total,
                             per_file=per_file, ranges=len(edits))


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return ""


def report_feedback(base_url: str, api_key: str, interaction_id: str | None = None, kind: str = "accept",
                    value: float | None = None, data: dict[str, Any] | None = None, *,
                    session_id: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """POST one event to `{base_url}/feedback` (base_url ends in /v1); returns the stored event."""
    import httpx

    if not interaction_id and not session_id:
        raise EtudeError("report_feedback needs an interaction_id or a session_id")
    body: dict[str, Any] = {"kind": kind, "value": value, "data": dict(data or {})}
    body.update({"interaction_id": interaction_id} if interaction_id else {"session_id": session_id})
    try:
        r = httpx.post(f"{base_url.rstrip('/')}/feedback", json=body, timeout=timeout_s,
                       headers={"authorization": f"Bearer {api_key}"})
    except httpx.HTTPError as e:
        raise EtudeError(f"cannot reach {base_url}: {e}") from e
    if r.status_code != 200:
        raise EtudeError(f"feedback refused (HTTP {r.status_code}): {_message(r)}")
    return r.json()


def _message(r: Any) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]


def report_edit_persistence(base_url: str, api_key: str, repo: str | Path, edits: Iterable[AgentWrite], *,
                            interaction_id: str | None = None, session_id: str | None = None,
                            delay_s: float | None = None) -> dict[str, Any]:
    """Measure persistence of `edits` in `repo` now and report it."""
    rep = measure_edit_persistence(repo, list(edits))
    return report_feedback(base_url, api_key, interaction_id, "edit_persistence", rep.score, rep.data(delay_s),
                           session_id=session_id)


def report_latency(base_url: str, api_key: str, ttft_s: float | None, total_s: float, *,
                   interaction_id: str | None = None, session_id: str | None = None) -> dict[str, Any]:
    """Client-side latency (time to first token, total), in seconds."""
    return report_feedback(base_url, api_key, interaction_id, "latency", total_s,
                           {"ttft_s": ttft_s, "total_s": total_s}, session_id=session_id)
