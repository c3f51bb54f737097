"""`TasksEnv`: repository tasks as an RL environment (`protocols.Env`) — multi-turn episodes
through the harness and the sandbox (`run_episode`), graded in a clean copy and scored by
`etude.rewards.score` under the `rewards` table (`[env.rewards]`: weights, budgets, flag policy;
defaults when absent). The single-turn families live in `etude.envs.families`.

Tasks come from `tasks_file`: a JSONL, or `builtin:curriculum:SPLIT[:LEVEL]` (the curriculum's
package-disjoint split), or, when unset, the built-in suite. Evaluation uses `eval_tasks_file`
(e.g. the curriculum's validation split) when given, else the last `num_test` tasks of the file.

Episodes of one rollout run `workers` at a time; a local model then answers the waiting turns of
all of them in one batch (`etude.policy.batcher.BatchedPolicy`). On Ctrl-C (or an episode that
raises) the running episodes end after their current turn and queued ones never start. `choose`
picks a batch's tasks by their success so far (weight p(1-p) + 0.05 with p the smoothed success
rate), so tasks that are always or never solved — whose GRPO groups carry no signal — are drawn
less. Every episode's `meta` carries what hack monitoring plots: flags, edits of test files, broken calls,
clarifications, answer length, turns. Not guaranteed: the success statistics are not saved in
checkpoints (a resumed run starts them afresh).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from etude.envs.episode import run_episode
from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.policy.batcher import BatchedPolicy, batchable
from etude.rewards import RewardConfig, score
from etude.rewards.terms import answers, asks_question
from etude.tasks import builtin_suite, load_tasks, seal
from etude.tasks.curriculum import builtin_curriculum
from etude.tasks.history_suite import builtin_history
from etude.types import Episode, Message, Problem, Task, TurnSample


class RolloutStopped(Exception):
    """Ends an episode between turns once its rollout is stopped (Ctrl-C or a failed episode)."""


def load_task_spec(spec: str, limit: int | None = None, *, use: str, where: str = "env tasks") -> list[Task]:
    """A JSONL path, or builtin:curriculum:SPLIT[:LEVEL], builtin:history[:before=D][:after=D], or
    builtin:SPLIT (the built-in suite). `use` says why (etude.tasks.seal.USES): a sealed test split
    is refused for every use but "final"."""
    if spec == "builtin:history" or spec.startswith("builtin:history:"):
        return seal.guard(builtin_history(spec, limit), use=use, where=where)
    if spec.startswith("builtin:curriculum:"):
        split, _, level = spec.removeprefix("builtin:curriculum:").partition(":")
        if level and not level.isdigit():
            raise EtudeError(f"bad curriculum level in {spec!r}")
        return builtin_curriculum(split, int(level or 1), max_tasks=limit, use=use)
    if spec.startswith("builtin:"):
        return builtin_suite(spec.split(":", 1)[1] or "eval", limit, use=use)  # a bare builtin: is the eval split, as in etude eval
    tasks = list(load_tasks(spec))
    return seal.guard(tasks[:limit] if limit else tasks, use=use, where=where)


class TasksEnv:
    """Multi-turn repository tasks (see the module doc)."""

    name = "tasks"

    def __init__(self, tasks_file: str | None = None, num_train: int = 8, num_test: int = 1, max_steps: int = 6,
                 eval_tasks_file: str | None = None, workers: int = 1, harness: dict[str, Any] | None = None,
                 rewards: dict[str, Any] | None = None):
        self.tasks_file, self.num_train, self.num_test, self.max_steps = tasks_file, num_train, num_test, max_steps
        self.eval_tasks_file, self.workers = eval_tasks_file, max(1, workers)
        self.harness = dict(harness or {})
        HarnessConfig.from_table({**self.harness, "max_steps": max_steps}, "env.harness")  # a bad key fails now
        self.reward_config = RewardConfig.from_dict(rewards or {})  # `[env.rewards]`: weights, budgets, flags
        self._cache: dict[str, list[Task]] = {}
        self._stats: dict[str, list[int]] = {}  # task id -> [solved, tried]
        self._lock = threading.Lock()
        self._wrapped: tuple[Any, Any] | None = None  # (policy, its batched wrapper)

    def _tasks(self, split: str) -> list[Task]:
        if split in self._cache:
            return self._cache[split]
        if self.tasks_file and self.tasks_file.startswith("builtin:curriculum:"):
            if split == "train":
                self._cache["train"] = load_task_spec(self.tasks_file, self.num_train, use="train",
                                                      where="env.tasks_file")
            else:
                spec = self.eval_tasks_file or self.tasks_file.rsplit(":", 1)[0].replace(":train", ":validation")
                self._cache["test"] = load_task_spec(spec, self.num_test, use="select", where="env.eval_tasks_file")
        elif self.tasks_file:
            every = load_task_spec(self.tasks_file, use="train", where="env.tasks_file")
            cut = max(1, len(every) - self.num_test)
            self._cache["train"] = every[:cut][: self.num_train]
            self._cache["test"] = (load_task_spec(self.eval_tasks_file, self.num_test, use="select",
                                                  where="env.eval_tasks_file") if self.eval_tasks_file
                                   else every[cut:])
        elif split == "train":  # no tasks_file: the built-in suite's train packages ...
            self._cache["train"] = builtin_suite("train", self.num_train, use="train")
        else:  # ... evaluated (and alarmed on) on the curriculum's validation packages, never the sealed split
            self._cache["test"] = builtin_curriculum("validation", 1, max_tasks=self.num_test, use="select")
        return self._cache[split]

    def problems(self, split: str) -> list[Problem]:
        if split not in ("train", "test"):
            raise EtudeError(f"unknown split {split!r}")
        return [Problem(t.instance_id, "tasks", (Message("user", t.problem_statement),), t) for t in self._tasks(split)]

    # -- curriculum

    def choose(self, problems: Sequence[Problem], k: int, rng: random.Random) -> list[int]:
        """`k` distinct problem indices, weighted towards tasks solved about half the time."""
        with self._lock:
            w = []
            for p in problems:
                solved, tried = self._stats.get(p.id, [0, 0])
                rate = (solved + 1) / (tried + 2)
                w.append(rate * (1 - rate) + 0.05)
        idx: list[int] = []
        pool = list(range(len(problems)))
        for _ in range(min(k, len(pool))):
            i = rng.choices(range(len(pool)), weights=[w[j] for j in pool])[0]
            idx.append(pool.pop(i))
        return idx

    def success_rates(self) -> dict[str, float]:
        with self._lock:
            return {t: s / n for t, (s, n) in self._stats.items() if n}

    # -- episodes

    def _policy(self, policy: Any) -> Any:
        if self.workers == 1 or not batchable(policy):
            return policy
        if self._wrapped is None or self._wrapped[0] is not policy:
            self._wrapped = (policy, BatchedPolicy(policy, max_batch=self.workers))
        return self._wrapped[1]

    def rollout(self, policy: Any, problems: Sequence[Problem], *, n: int, max_tokens: int, temperature: float,
                top_p: float = 1.0, seed: int | None = None) -> list[Episode]:
        hc = HarnessConfig(**{**self.harness, "max_steps": self.max_steps, "max_tokens_per_turn": max_tokens,
                              "temperature": temperature})
        pol = self._policy(policy)
        jobs = [p for p in problems for _ in range(n)]  # prompt-major, as the learner groups them
        stop = threading.Event()
        pool = ThreadPoolExecutor(self.workers)
        try:
            futures = [pool.submit(self._one, pol, p, hc, stop) for p in jobs]
            pending = set(futures)
            while pending:
                # wake every 0.2 s: a Ctrl-C the kernel handed to a worker thread runs its handler
                # only when the main thread runs again, and a wait without a timeout would sleep
                # until an episode ends (seen with the whole test suite's threads about)
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                for f in done:
                    f.result()  # an episode that failed stops the others now
            return [f.result() for f in futures]
        except BaseException:
            # Ctrl-C, or an episode that failed: queued episodes never start and those in flight
            # end after their current turn, instead of the whole step running to its end first.
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _one(self, policy: Any, p: Problem, hc: HarnessConfig, stop: threading.Event) -> Episode:
        def check(_turn: Any = None) -> None:
            if stop.is_set():
                raise RolloutStopped("the rollout was stopped")

        check()  # a queued episode a worker takes up after the stop does not start
        traj, outcome = run_episode(p.answer, policy, hc, on_turn=check)
        br = score(traj, p.answer, outcome, self.reward_config)
        with self._lock:
            s = self._stats.setdefault(p.id, [0, 0])
            s[0] += int(outcome.resolved)
            s[1] += 1
        turns = [TurnSample.of(t.generation) for t in traj.turns if t.generation.token_ids]
        flags = [f.name for f in br.flags]
        said = answers(traj)
        meta = {
            "stop": traj.stop_reason,
            "hack_flags": float(len(flags)),
            "test_edits": float(sum(1 for f in flags if f in ("test_file_edit", "conftest_edit"))),
            "broken_calls": float(traj.broken_calls),
            "clarifications": float(sum(1 for a in said if asks_question(a))),
            "answer_chars": float(len(traj.final_message)),
            "turns": float(len(traj.turns)),
            "tokens": float(traj.prompt_tokens + traj.completion_tokens),
            "flags": flags,
        }
        return Episode(p.id, p.family, br.total, dict(br.terms), outcome.resolved, turns,
                       traj.policy_version, traj.final_message, meta)
