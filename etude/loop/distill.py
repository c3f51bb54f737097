"""Distillation: logged interactions + feedback -> scored samples for the trainer.

```python
res = distill(store, "acme", window=(t0, t1), config=DistillConfig(max_staleness=2))
res.samples          # list[ScoredSample]: token ids, behaviour log-probs, policy version, RewardBreakdown
res.excluded_stale   # interactions left out because their checkpoint is too old (also per checkpoint)
[s.to_episode() for s in res]   # etude.types.Episode, what the learner consumes
```

Each interaction becomes a one-turn `Trajectory` (the request messages, the answer, the turn's
`Generation` rebuilt from the stored prompt/completion token ids and log-probs) with
`meta["feedback"]` filled from the feedback events, then scored by `etude.rewards.score` with
`outcome=None` (production has no test verdict). So the production reward terms (edit
persistence, follow-up, latency) and the behaviour terms (broken calls, needless clarification,
verbosity, unsupported claims) are the rewards issue's own functions, not re-implemented here.

Never filtered out: interactions whose answer had malformed tool calls (they carry
`parse_errors`, so `broken_calls` is negative) and answers that only ask a question (scored by
`needless_clarification`). The only exclusions are staleness (policy version more than
`max_staleness` behind the reference version) and, if configured, checkpoints outside
`checkpoints`; both are counted.

Every turn is scored by what judged it. Interactions are grouped into *episodes*: in a
session, in time order, a request whose last message is the user's starts one, and the requests
that carry tool results back continue it (the agent's turns on one user request, a follow-up's
answer being an episode of its own). Signals -> meta["feedback"]:
- per turn: the newest `edit_persistence` event on that interaction gives edit_persistence and
  reverted (persistence judges the edits that turn wrote); latency is the client's reported total
  if any, else the server's measured latency;
- per episode (applied to every turn of it, whichever of its interactions the event was posted
  on): the newest `accept` / `reject` gives `accepted` True / False; the newest `followup` event
  (the server labels the next user message and attaches it to the newest turn before it) gives
  the label, else a `retry` means "dissatisfied".
- `latency_reference_s`: the median server latency of the reference checkpoint's interactions in
  the window (the org's production checkpoint, i.e. the production arm) whose prompt has the same
  size bucket (log2 of the prompt tokens), the nearest bucket with at least `min_reference`
  interactions if that one has fewer, all of its interactions if no bucket has enough; the
  window's interactions of every checkpoint when production answered none. The latency term is
  measured against it (etude.rewards.production), so it never saturates.
A tool call's result is read from the next interaction of the same session that carries the turn
back (a tool message answering its id there; "Error:" marks a failure; `tool_results`); a call
whose result never came back is not counted as broken.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from etude.rewards import RewardConfig, score
from etude.serve.registry import production
from etude.types import (
    Episode,
    Generation,
    Message,
    RewardBreakdown,
    ToolCall,
    ToolExecution,
    ToolResult,
    Trajectory,
    Turn,
    TurnSample,
)


@dataclass
class DistillConfig:
    max_staleness: int = 2
    """versions behind `reference_version` an interaction's policy may be and still count."""
    reference_version: int | None = None
    """default: the org's production checkpoint's version, else the newest version in the window."""
    checkpoints: tuple[str, ...] | None = None
    """only these checkpoints (e.g. the arms of one experiment); None = all."""
    latency_budget_s: float = 20.0
    """latency term without a reference: -latency / (latency + budget) (half at the budget)."""
    min_reference: int = 3
    """interactions a size bucket needs to give the latency reference on its own."""
    reward: Any = None
    """etude.rewards.RewardConfig (None: its defaults)."""


@dataclass(frozen=True)
class ScoredSample:
    interaction_id: str
    org_id: str
    checkpoint: str
    policy_version: int
    prompt_token_ids: tuple[int, ...]  # [num_prompt_tokens]
    completion_token_ids: tuple[int, ...]  # [num_completion_tokens]
    behaviour_logprobs: tuple[float, ...]  # [num_completion_tokens], logged at serving time
    reward: RewardBreakdown
    trajectory: Trajectory
    user_id: str = ""
    session_id: str = ""
    experiment_id: str | None = None
    arm: str | None = None
    created_at: float = 0.0

    def to_episode(self) -> Episode:
        """The learner's `etude.types.Episode`."""
        turn = TurnSample(list(self.prompt_token_ids), list(self.completion_token_ids), list(self.behaviour_logprobs))
        return Episode(problem_id=self.interaction_id, family="production", reward=self.reward.total,
                       terms=dict(self.reward.terms), resolved=False, turns=[turn], policy_version=self.policy_version,
                       text=self.trajectory.final_message,
                       meta={"checkpoint": self.checkpoint, "arm": self.arm, "org_id": self.org_id})

    def to_dict(self) -> dict[str, Any]:
        return {"interaction_id": self.interaction_id, "org_id": self.org_id, "checkpoint": self.checkpoint,
                "policy_version": self.policy_version, "prompt_token_ids": list(self.prompt_token_ids),
                "completion_token_ids": list(self.completion_token_ids),
                "behaviour_logprobs": list(self.behaviour_logprobs), "reward": self.reward.to_dict(),
                "feedback": self.trajectory.meta.get("feedback", {}), "user_id": self.user_id,
                "session_id": self.session_id, "experiment_id": self.experiment_id, "arm": self.arm,
                "created_at": self.created_at}


@dataclass
class DistillResult:
    samples: list[ScoredSample]
    excluded_stale: int
    excluded_by_checkpoint: dict[str, int] = field(default_factory=dict)
    excluded_other: int = 0  # outside `checkpoints`
    reference_version: int | None = None
    n_interactions: int = 0

    def __iter__(self) -> Iterator[ScoredSample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def summary(self) -> dict[str, Any]:
        return {"samples": len(self.samples), "interactions": self.n_interactions,
                "excluded_stale": self.excluded_stale, "excluded_by_checkpoint": self.excluded_by_checkpoint,
                "excluded_other": self.excluded_other, "reference_version": self.reference_version,
                "mean_reward": sum(s.reward.total for s in self.samples) / len(self.samples) if self.samples else None}


def distill(store: Any, org: str, window: tuple[float | None, float | None] | None = None,
            config: DistillConfig | None = None) -> DistillResult:
    """Score every interaction of `org` in `window` (since, until) (see module docstring)."""
    cfg = config or DistillConfig()
    since, until = window or (None, None)
    rows = store.interactions(org=org, since=since, until=until, with_messages=True)
    ref = _reference_version(store, org, rows, cfg)
    keep, stale, other = [], Counter(), 0
    for r in rows:
        if cfg.checkpoints is not None and r["checkpoint"] not in cfg.checkpoints:
            other += 1
        elif ref is not None and ref - int(r["policy_version"]) > cfg.max_staleness:
            stale[r["checkpoint"]] += 1
        else:
            keep.append(r)
    events = _events_by_interaction(store.feedback(org=org, interaction_ids=[r["id"] for r in rows]))
    results = tool_results(rows)
    episodes = episode_of(rows)
    judged = _episode_events(episodes, events)
    prod = production(store, org)
    lat_ref = LatencyReference.from_rows(rows, prod.name if prod else None, cfg.min_reference)
    rcfg = cfg.reward or RewardConfig()
    samples = []
    for r in keep:
        traj = to_trajectory(r, events.get(r["id"], []), results.get(r["id"], {}), cfg.latency_budget_s,
                             episode_events=judged.get(episodes[r["id"]], []),
                             latency_reference_s=lat_ref.for_row(r), episode=episodes[r["id"]])
        samples.append(_sample(r, traj, score(traj, None, None, rcfg)))
    return DistillResult(samples, sum(stale.values()), dict(stale), other, ref, len(rows))


# -- episodes and the latency reference --------------------------------------------------------
JUDGEMENTS = ("accept", "reject", "followup", "retry")  # events that judge a whole episode


def _last_role(row: dict[str, Any]) -> str | None:
    msgs = row.get("messages") or []
    return msgs[-1]["role"] if msgs else None


def episode_of(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """interaction id -> episode id ("<session>#<k>"): per session in time order, a request
    ending with a user message (or the session's first request) opens episode k+1; requests
    ending with tool results continue the current one."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_session.setdefault(r["session_id"] or r["id"], []).append(r)
    out: dict[str, str] = {}
    for sid, rs in by_session.items():
        k = 0
        for i, r in enumerate(sorted(rs, key=lambda r: (r["created_at"], r["id"]))):
            if i > 0 and _last_role(r) not in ("tool", "assistant"):
                k += 1
            out[r["id"]] = f"{sid}#{k}"
    return out


def _episode_events(episodes: dict[str, str], events: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for iid, evs in events.items():
        if iid in episodes:
            out.setdefault(episodes[iid], []).extend(e for e in evs if e["kind"] in JUDGEMENTS)
    for evs in out.values():
        evs.sort(key=lambda e: e["created_at"])
    return out


def size_bucket(prompt_tokens: int) -> int:
    """Requests of the same size for the latency reference: floor(log2(prompt tokens))."""
    return int(math.log2(max(1, int(prompt_tokens or 0))))


@dataclass
class LatencyReference:
    """Median latency per prompt-size bucket of the reference checkpoint (the production arm)."""

    medians: dict[int, float]
    counts: dict[int, int]
    overall: float | None
    min_count: int = 3

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]], checkpoint: str | None, min_count: int = 3) -> LatencyReference:
        ref = [r for r in rows if r["checkpoint"] == checkpoint] or list(rows)
        by: dict[int, list[float]] = {}
        for r in ref:
            by.setdefault(size_bucket(r["prompt_tokens"]), []).append(float(r["latency_s"]))
        lats = [x for v in by.values() for x in v]
        return cls({b: statistics.median(v) for b, v in by.items()}, {b: len(v) for b, v in by.items()},
                   statistics.median(lats) if lats else None, min_count)

    def for_row(self, row: dict[str, Any]) -> float | None:
        b = size_bucket(row["prompt_tokens"])
        ok = [k for k, n in self.counts.items() if n >= self.min_count]
        if not ok:
            return self.overall
        return self.medians[min(ok, key=lambda k: (abs(k - b), k))]


def _reference_version(store: Any, org: str, rows: Sequence[dict[str, Any]], cfg: DistillConfig) -> int | None:
    if cfg.reference_version is not None:
        return cfg.reference_version
    prod = production(store, org)
    if prod is not None:
        return prod.version
    return max((int(r["policy_version"]) for r in rows), default=None)


def _events_by_interaction(events: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events:  # oldest first, so "newest wins" is the last assignment
        out.setdefault(e["interaction_id"], []).append(e)
    return out


def feedback_meta(row: dict[str, Any], events: Sequence[dict[str, Any]], latency_budget_s: float,
                  episode_events: Sequence[dict[str, Any]] | None = None,
                  latency_reference_s: float | None = None) -> dict[str, Any]:
    """The `trajectory.meta["feedback"]` dict the reward terms read (see module docstring).
    `events` are the interaction's own; `episode_events` the judgements (accept, reject,
    followup, retry) posted on any turn of its episode (None: the interaction's own)."""
    fb: dict[str, Any] = {"latency_s": row["latency_s"], "latency_budget_s": latency_budget_s}
    if latency_reference_s is not None:
        fb["latency_reference_s"] = latency_reference_s
    retried = False
    judgements = [e for e in events if e["kind"] in JUDGEMENTS] if episode_events is None else list(episode_events)
    for e in [*[e for e in events if e["kind"] not in JUDGEMENTS], *judgements]:
        kind, data = e["kind"], e["data"] or {}
        if kind == "edit_persistence":
            fb["edit_persistence"] = e["value"]
            fb["reverted"] = bool(data.get("reverted", False))
        elif kind == "followup" and data.get("label"):
            fb["followup"] = data["label"]
        elif kind == "retry":
            retried = True
        elif kind in ("accept", "reject"):
            fb["accepted"] = kind == "accept"
        elif kind == "latency":
            total = data.get("total_s", e["value"])
            if total is not None:
                fb["latency_s"] = float(total)
        fb.setdefault("events", []).append(kind)
    if "followup" not in fb and retried:
        fb["followup"] = "dissatisfied"
    return fb


def tool_results(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per interaction id, what its tool calls returned: call id -> the content of the tool message
    answering it in the session's next request that carries this turn back (its messages are this
    request's, then this turn's assistant message, then the tool messages). Matched within the
    session and the turn, never by call id alone: a reply's calls are numbered from `call_0` by
    text parsers (etude serve's, until its ids became unique per interaction), so one id names a
    call of every turn of every session. An interaction no later request answers has no results
    (its calls are not counted as broken)."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_session.setdefault(r.get("session_id") or r["id"], []).append(r)
    out: dict[str, dict[str, str]] = {}
    for session in by_session.values():
        session.sort(key=lambda r: r["created_at"])
        for i, r in enumerate(session):
            n = len(r.get("messages") or [])
            for later in session[i + 1:]:
                msgs = later.get("messages") or []
                if len(msgs) <= n or msgs[n]["role"] != "assistant":
                    continue
                res: dict[str, str] = {}
                for m in msgs[n + 1:]:
                    if m["role"] != "tool":
                        break
                    if m.get("tool_call_id"):
                        res.setdefault(m["tool_call_id"], m["content"])
                out[r["id"]] = res
                break
    return out


def to_trajectory(row: dict[str, Any], events: Sequence[dict[str, Any]], results: dict[str, str],
                  latency_budget_s: float = 20.0, *, episode_events: Sequence[dict[str, Any]] | None = None,
                  latency_reference_s: float | None = None, episode: str | None = None) -> Trajectory:
    """One logged interaction as a one-turn Trajectory with meta["feedback"] (and meta["episode"])."""
    resp = row["response"] or {}
    calls = tuple(_call(c) for c in resp.get("tool_calls") or ())
    gen = Generation(text=resp.get("raw_text", resp.get("content", "")), prompt_token_ids=tuple(row["prompt_token_ids"]),
                     token_ids=tuple(row["completion_token_ids"]), logprobs=tuple(row["logprobs"]),
                     finish_reason=row["finish_reason"], policy_id=row["checkpoint"],
                     policy_version=int(row["policy_version"]), tool_calls=calls or None, latency_s=row["latency_s"])
    execs = tuple(ToolExecution(call=c, result=_result(results.get(c.id)), started_s=0.0, duration_s=0.0) for c in calls)
    turn = Turn(index=0, generation=gen, tool_executions=execs, parse_errors=tuple(resp.get("parse_errors") or ()))
    msgs = [Message.from_dict({**m, "tool_calls": m.get("tool_calls") or ()}) for m in row.get("messages", [])]
    msgs.append(Message(role="assistant", content=resp.get("content", ""), tool_calls=calls))
    stop = "max_tokens" if row["finish_reason"] == "length" else "answer"
    meta = {"feedback": feedback_meta(row, events, latency_budget_s, episode_events, latency_reference_s),
            "interaction_id": row["id"], "episode": episode,
            "source": "production", "arm": row.get("arm"), "experiment_id": row.get("experiment_id")}
    return Trajectory(episode_id=row["id"], task_id=None, policy_id=row["checkpoint"],
                      policy_version=int(row["policy_version"]), messages=tuple(msgs), turns=(turn,),
                      stop_reason=stop, wall_s=row["latency_s"], prompt_tokens=row["prompt_tokens"],
                      completion_tokens=row["completion_tokens"], config=dict(row.get("params") or {}), meta=meta)


def _call(c: dict[str, Any]) -> ToolCall:
    fn = c.get("function", {})
    args = fn.get("arguments", "{}")
    return ToolCall(id=c["id"], name=fn.get("name", ""), arguments=json.loads(args) if isinstance(args, str) else args)


def _result(content: str | None) -> ToolResult:
    if content is None:
        return ToolResult(ok=True, meta={"result_seen": False})
    if content.startswith("Error:"):
        return ToolResult(ok=False, error=content[6:].strip().splitlines()[0] if content[6:].strip() else "error",
                          output=content, meta={"result_seen": True})
    return ToolResult(ok=True, output=content, meta={"result_seen": True})


def _sample(r: dict[str, Any], traj: Trajectory, reward: RewardBreakdown) -> ScoredSample:
    return ScoredSample(interaction_id=r["id"], org_id=r["org_id"], checkpoint=r["checkpoint"],
                        policy_version=int(r["policy_version"]), prompt_token_ids=tuple(r["prompt_token_ids"]),
                        completion_token_ids=tuple(r["completion_token_ids"]),
                        behaviour_logprobs=tuple(r["logprobs"]), reward=reward, trajectory=traj,
                        user_id=r["user_id"], session_id=r["session_id"], experiment_id=r.get("experiment_id"),
                        arm=r.get("arm"), created_at=r["created_at"])
