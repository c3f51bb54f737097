"""`TasksEnv`: repository tasks as an RL environment (`protocols.Env`) — multi-turn episodes
through the harness and the sandbox (`run_episode`), graded in a clean copy and scored by
`etude.rewards.score`. The single-turn families live in `etude.train.envs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from etude.envs.episode import run_episode
from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.rewards import RewardConfig, score
from etude.tasks import builtin_suite, load_tasks
from etude.types import Episode, Message, Problem, Task, TurnSample


class TasksEnv:
    """Multi-turn repository tasks: harness + sandbox episodes, graded in a clean copy.

    Problems come from `tasks_file` (the last `num_test` tasks are held out) or from the
    built-in suite (`etude.tasks.builtin_suite`: its train split, at most `num_train` tasks,
    and its eval split, at most `num_test`), built on first use.
    """

    name = "tasks"

    def __init__(self, tasks_file: str | None = None, num_train: int = 8, num_test: int = 1, max_steps: int = 6,
                 **_: Any):
        self.tasks_file, self.num_train, self.num_test, self.max_steps = tasks_file, num_train, num_test, max_steps
        self._cache: dict[str, list[Task]] = {}

    def _tasks(self, split: str) -> list[Task]:
        if split not in self._cache:
            if self.tasks_file:
                every = list(load_tasks(self.tasks_file))
                cut = max(1, len(every) - self.num_test)
                self._cache = {"train": every[:cut][: self.num_train], "test": every[cut:]}
            else:
                self._cache[split] = list(builtin_suite("train" if split == "train" else "eval",
                                                        self.num_train if split == "train" else self.num_test))
        return self._cache[split]

    def problems(self, split: str) -> list[Problem]:
        if split not in ("train", "test"):
            raise EtudeError(f"unknown split {split!r}")
        return [Problem(t.instance_id, "tasks", (Message("user", t.problem_statement),), t) for t in self._tasks(split)]

    def rollout(self, policy: Any, problems: Sequence[Problem], *, n: int, max_tokens: int, temperature: float,
                top_p: float = 1.0, seed: int | None = None) -> list[Episode]:
        hc = HarnessConfig(max_steps=self.max_steps, max_tokens_per_turn=max_tokens, temperature=temperature)
        out = []
        for p in problems:
            for _ in range(n):
                traj, outcome = run_episode(p.answer, policy, hc)
                br = score(traj, p.answer, outcome, RewardConfig())
                turns = [TurnSample.of(t.generation) for t in traj.turns if t.generation.token_ids]
                out.append(Episode(p.id, p.family, br.total, dict(br.terms), outcome.resolved, turns,
                                   traj.policy_version, traj.final_message, {"stop": traj.stop_reason}))
        return out
