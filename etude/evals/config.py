"""`EvalConfig`: every knob of `etude eval`, documented where it is declared, and its TOML
loader (`etude eval --config FILE.toml`): top-level keys are EvalConfig's fields, a `[harness]`
table gives HarnessConfig's and a `[reward]` table RewardConfig's; keys and types are checked by
etude.configfile (an unknown key or a wrong type is one error naming the file)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import build, load_with
from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.rewards import RewardConfig


def _default_adherence_weights() -> dict[str, float]:
    # Which files and how much is the strongest evidence of a patch that fits the codebase;
    # style is the weakest (a formatter can fix it), so it weighs least.
    return {"files": 0.25, "size": 0.2, "duplicates": 0.15, "imports": 0.15, "lint": 0.15, "format": 0.1}


@dataclass
class EvalConfig:
    """How one evaluation run is done. The harness and reward configs are the components' own."""

    workers: int = 2
    """Episodes in flight at once (each has its own sandboxed workspace)."""
    executor: str = "ray"
    """Where episodes run: "ray" (each episode a Ray task, the policy in one Ray actor; see
    etude.evals.raypool) or "threads" (a thread pool in this process, the policy in-process)."""
    ray_address: str | None = None
    """Ray cluster to join ("HOST:PORT" of `ray start --head`, or "auto"); None starts a local Ray
    for the run (and stops it after). A Ray this process already joined is used as it is."""
    ray_task_cpus: float = 0.25
    """CPUs Ray reserves per episode task: below 1 so several episodes share a core (an episode
    mostly waits on the model or on its sandboxed commands)."""
    samples: int = 1
    """Episodes per task (k); pass@k is reported for every k from 1 to this."""
    max_tasks: int | None = None
    """Evaluate only the first N tasks of the suite."""
    harness: Any = None
    """An etude.harness.HarnessConfig; None = HarnessConfig() with `max_steps` below."""
    max_steps: int = 30
    """Turns per episode when `harness` is None."""
    reward: Any = None
    """An etude.rewards.RewardConfig; None = its defaults."""
    model_name: str | None = None
    """For an OpenAI-compatible URL: the served model name (also settable as URL#NAME)."""
    backend: str = "hf"
    """Engine for a local model spec ("smollm2", "tiny", a directory): "hf" (transformers) or
    "vllm" (etude.policy.vllm_backend; needs `make setup-vllm`). Other specs ignore it."""
    bootstrap: int = 2000
    """Bootstrap resamples (of tasks) for confidence intervals."""
    confidence: float = 0.95
    """Level of every confidence interval."""
    seed: int = 0
    """Seed of the bootstrap (results are reproducible for a given run)."""
    adherence_weights: dict[str, float] = field(default_factory=_default_adherence_weights)
    """Adherence component -> weight in the combined score (see docs/evals.md)."""
    ruff_select: tuple[str, ...] = ("E4", "E7", "E9", "F")
    """ruff rules for the lint delta (ruff's defaults, run with --isolated)."""
    retry_errors: bool = True
    """On resume, run again the tasks whose record is an infrastructure error."""
    report: bool = True
    """Write report.html (and plots) after the run."""
    progress: bool = True
    """Show a rich progress bar on stderr."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.samples < 1:
            raise EtudeError("workers and samples must be at least 1")
        if self.executor not in ("ray", "threads"):
            raise EtudeError(f"executor must be ray or threads, not {self.executor!r}")
        if not 0 < self.ray_task_cpus <= 64:
            raise EtudeError(f"ray_task_cpus must be in (0, 64], not {self.ray_task_cpus}")
        if self.backend not in ("hf", "vllm"):
            raise EtudeError(f"backend must be hf or vllm, not {self.backend!r}")
        if not 0.5 <= self.confidence < 1:
            raise EtudeError(f"confidence must be in [0.5, 1), not {self.confidence}")
        unknown = set(self.adherence_weights) - set(_default_adherence_weights())
        if unknown:
            raise EtudeError(f"unknown adherence component(s): {', '.join(sorted(unknown))}")

    def harness_config(self) -> Any:
        return self.harness or HarnessConfig(max_steps=self.max_steps)

    def reward_config(self) -> Any:
        return self.reward or RewardConfig()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalConfig:
        """From a config table: `harness` and `reward` sub-tables become their components' configs."""
        d = dict(d)
        for key in ("harness", "reward"):
            if key in d and not isinstance(d[key], dict):
                raise EtudeError(f"[{key}] must be a table, not {type(d[key]).__name__} ({d[key]!r})")
        if "harness" in d:
            d["harness"] = build(HarnessConfig, d["harness"], "harness")
        if "reward" in d:
            d["reward"] = RewardConfig.from_dict(d["reward"], "reward")
        return build(cls, d, "")

    @classmethod
    def from_toml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> EvalConfig:
        """From a TOML file, `overrides` (dotted keys, e.g. "harness.max_steps") applied on top;
        errors name the file."""
        return load_with(cls.from_dict, path, "eval config", overrides=overrides)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["harness"] = self.harness_config().to_dict()
        d["reward"] = self.reward_config().to_dict()
        d["ruff_select"] = list(self.ruff_select)
        return d
