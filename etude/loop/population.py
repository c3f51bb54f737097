"""The simulated user population's behaviour: who the users are and how each one reacts to a
change, given whether it is right. Pure and seeded (no I/O); `etude.loop.users` runs the sessions
(the real agent client against the real server) and calls `UserModel.react` once per change.

A user never reads a hidden test or the gold patch. The simulator grades each change once
(`etude.envs.grade`) and hands the user one bit, `correct`; everything after is behaviour drawn
from the probabilities below, shifted per user by a persistent leniency (some people keep more and
complain less than others), so the signal reaches the loop through noise:

| parameter | default | meaning |
|---|---|---|
| `p_keep_good` / `p_keep_bad` | 0.80 / 0.35 | keep (accept) a correct / wrong change; otherwise reject it and revert it |
| `p_dissatisfied_good` / `_bad` | 0.08 / 0.35 | send a dissatisfied follow-up ("it still fails ...") after a correct / wrong change |
| `p_satisfied_good` / `_bad` | 0.20 / 0.04 | say thanks (a satisfied follow-up) instead |
| `p_abandon` | 0.15 | leave without any explicit verdict or follow-up (the change's fate is still decided) |
| `overwrite_good` / `_bad` | 0.15 / 0.40 | mean share of the agent's kept lines the user later rewrites |
| `overwrite_concentration` | 4.0 | Beta concentration of that share (lower: more spread between sessions) |
| `user_sd` | 0.5 | sd of the per-user leniency on the logit scale (keep up, complaints down) |
| `persistence_delay_s` | 1.0 | seconds between the session's end and the persistence measurement |
| `max_followups` | 1 | dissatisfied follow-ups a session may have (each answer is judged again) |

Why these defaults (a judgement, not a fit: Cursor publishes its lifts, not its users' noise).
Cursor's per-checkpoint readouts were +2.28% edits persisting and -3.13% dissatisfied follow-ups
(relative), i.e. a real improvement moves the per-user signals by a few percent. With these
defaults a 5-point gain in the resolved rate at a 30% baseline moves the keep rate by
0.05 x (0.80 - 0.35) = 2.3 points on 0.485 (+4.6%) and the dissatisfied rate by -1.35 points on
0.269 (-5.0%), before abandonment and per-user leniency add variance: the same order as
Cursor's lifts, so the canary needs hundreds of users per arm to see them, as theirs did. As a
classifier of correctness one keep/reject has Youden's J = 0.45 (about 72% right at a 50% base
rate), one follow-up J = 0.27, so no single signal is the grade in disguise. `expected()` gives
these figures for any parameters.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from etude.errors import EtudeError
from etude.types import Task

DISSATISFIED_MESSAGES = (
    "It still fails: the tests do not pass with your change. Please fix it properly.",
    "That's wrong, it still doesn't work. Try again.",
    "This is not what I asked for; the bug is still there.",
    "No, that didn't fix it. The failing test still fails.",
)
SATISFIED_MESSAGES = ("Thanks, that works now.", "Perfect, thank you!", "Looks good, thanks.")


@dataclass(frozen=True)
class UserModel:
    """How users react to a change (see the module docstring for each default and why)."""

    p_keep_good: float = 0.80
    """keep (accept) a change the grade says is correct."""
    p_keep_bad: float = 0.35
    """keep (accept) a change the grade says is wrong."""
    p_dissatisfied_good: float = 0.08
    """dissatisfied follow-up after a correct change."""
    p_dissatisfied_bad: float = 0.35
    """dissatisfied follow-up after a wrong change."""
    p_satisfied_good: float = 0.20
    """satisfied follow-up ("thanks") after a correct change (when not dissatisfied)."""
    p_satisfied_bad: float = 0.04
    """satisfied follow-up after a wrong change (when not dissatisfied)."""
    p_abandon: float = 0.15
    """leave without an explicit verdict or follow-up."""
    overwrite_good: float = 0.15
    """mean share of a kept correct change's lines the user rewrites later."""
    overwrite_bad: float = 0.40
    """mean share of a kept wrong change's lines the user rewrites later."""
    overwrite_concentration: float = 4.0
    """Beta(mean * c, (1 - mean) * c) for the rewritten share."""
    user_sd: float = 0.5
    """per-user leniency ~ N(0, user_sd) on the logit scale: + on keeping, - on complaining."""
    persistence_delay_s: float = 1.0
    """wall seconds between the end of a session and the edit-persistence measurement."""
    max_followups: int = 1
    """dissatisfied follow-ups per session (each gets an answer, judged like the first)."""

    def __post_init__(self) -> None:
        probs = {k: v for k, v in asdict(self).items() if k.startswith(("p_", "overwrite_")) and k != "overwrite_concentration"}
        bad = [k for k, v in probs.items() if not 0.0 <= float(v) <= 1.0]
        if bad:
            raise EtudeError(f"[users] {', '.join(bad)} must be probabilities in [0, 1]")
        if self.overwrite_concentration <= 0 or self.user_sd < 0 or self.persistence_delay_s < 0 or self.max_followups < 0:
            raise EtudeError("[users] overwrite_concentration > 0, user_sd >= 0, persistence_delay_s >= 0, "
                             "max_followups >= 0")

    def react(self, correct: bool, rng: random.Random, leniency: float = 0.0) -> Reaction:
        """One user's reaction to one change (the only place `correct` is read)."""
        keep = _shift(self.p_keep_good if correct else self.p_keep_bad, leniency)
        dis = _shift(self.p_dissatisfied_good if correct else self.p_dissatisfied_bad, -leniency)
        sat = self.p_satisfied_good if correct else self.p_satisfied_bad
        mean = self.overwrite_good if correct else self.overwrite_bad
        abandon = rng.random() < self.p_abandon
        kept = rng.random() < keep
        u = rng.random()
        followup = "dissatisfied" if u < dis else "satisfied" if u < dis + (1 - dis) * sat else None
        share = _beta(rng, mean, self.overwrite_concentration)
        return Reaction(kept=kept, abandoned=abandon, followup=None if abandon else followup, overwrite_share=share)

    def expected(self, resolved_rate: float) -> dict[str, float]:
        """Population means (leniency 0) at a true resolved rate: keep rate, dissatisfied rate,
        and each signal's Youden J as a classifier of correctness."""
        r = resolved_rate
        explicit = 1 - self.p_abandon
        return {"keep_rate": r * self.p_keep_good + (1 - r) * self.p_keep_bad,
                "dissatisfied_rate": explicit * (r * self.p_dissatisfied_good + (1 - r) * self.p_dissatisfied_bad),
                "keep_youden_j": self.p_keep_good - self.p_keep_bad,
                "dissatisfied_youden_j": self.p_dissatisfied_bad - self.p_dissatisfied_good}


@dataclass(frozen=True)
class Reaction:
    kept: bool  # the change stays in the user's repository (accept); else it is reverted (reject)
    abandoned: bool  # no explicit accept / reject and no follow-up is sent
    followup: str | None  # "dissatisfied" | "satisfied" | None
    overwrite_share: float  # share of the kept agent lines the user rewrites afterwards


@dataclass(frozen=True)
class SimUser:
    id: str
    repo: str  # the repository (package) all this user's requests are about
    tasks: tuple[Task, ...]  # their stream of requests, in order (cycled)
    leniency: float
    seed: int

    def request(self, k: int) -> Task:
        """The user's k-th request (k counts over every round)."""
        return self.tasks[k % len(self.tasks)]


def repo_of(task: Task) -> str:
    return str(task.source.get("package") or task.repo)


def make_population(tasks: Sequence[Task], users: int, *, seed: int = 0, model: UserModel | None = None,
                    prefix: str = "user") -> list[SimUser]:
    """`users` users, each given one repository (round-robin over the repositories in `tasks`,
    in a seeded order) and a seeded shuffle of that repository's tasks as their request stream."""
    if not tasks:
        raise EtudeError("the user population needs at least one task")
    if users < 1:
        raise EtudeError("the user population needs at least one user")
    m = model or UserModel()
    by_repo: dict[str, list[Task]] = {}
    for t in tasks:
        by_repo.setdefault(repo_of(t), []).append(t)
    repos = sorted(by_repo)
    random.Random(seed).shuffle(repos)
    out = []
    for u in range(users):
        uid = f"{prefix}-{u:03d}"
        useed = _seed(seed, uid)
        rng = random.Random(useed)
        repo = repos[u % len(repos)]
        stream = list(by_repo[repo])
        rng.shuffle(stream)
        out.append(SimUser(uid, repo, tuple(stream), rng.gauss(0.0, m.user_sd) if m.user_sd else 0.0, useed))
    return out


def _seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


def session_rng(user: SimUser, round_key: str, k: int) -> random.Random:
    """The random stream of one session: fixed by (user, round, session index)."""
    return random.Random(_seed(user.seed, f"{round_key}:{k}"))


def _shift(p: float, logit_shift: float) -> float:
    if p <= 0.0 or p >= 1.0 or not logit_shift:
        return p
    z = math.log(p / (1 - p)) + logit_shift
    return 1 / (1 + math.exp(-z))


def _beta(rng: random.Random, mean: float, conc: float) -> float:
    if mean <= 0.0 or mean >= 1.0:
        return mean
    return rng.betavariate(mean * conc, (1 - mean) * conc)


@dataclass
class SessionSpec:
    """One session to run: the user, their request, and the session's random stream."""

    user: SimUser
    task: Task
    index: int
    rng: random.Random = field(repr=False, default_factory=random.Random)

    def extras(self) -> dict[str, Any]:
        return {"user": self.user.id, "repo": self.user.repo, "task": self.task.instance_id}
