"""`DemoConfig`: the stage parameters of `etude demo`, documented where they are declared, and
its TOML loader (`etude demo --config FILE`: the file's keys are DemoConfig fields, checked by
etude.configfile; command-line flags override them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import build, load_with


@dataclass(frozen=True)
class DemoConfig:
    model: str = "smollm2"
    """base model: "smollm2" (default), "tiny" (random; --quick) or a model directory."""
    out: str = "runs/demo"
    """everything this run writes: evals, checkpoints, the loop's database, the report."""
    eval_tasks: int = 30
    """held-out level-1 tasks (test-split packages) for the base and warm-start evaluations."""
    sft_tasks: int = 48
    """train-split tasks whose expert trajectories the general warm start learns from. At demo size
    it teaches the tool calls, not the fix (docs/demo.md)."""
    sft_epochs: float = 1.0
    agent_config: str = "configs/agent_sft.toml"
    """the agent's harness and the SFT hyperparameters (model and tasks are set by the demo)."""
    org: str = "acme"
    """the organisation the agent is specialised to."""
    org_repos: str = "click==8.1.7"
    """its repositories (NAME==VERSION or local git repositories, comma-separated); "example" is
    the small library shipped in etude/data/org_example, made a git repository under --out."""
    spec_minutes: float = 12.0
    """the specialisation's training budget (SFT + RL on the edit turn), wall minutes."""
    spec_tasks_per_repo: int = 120
    spec_drills_per_repo: int = 60
    spec_min_heldout: int = 30
    spec_general_tasks: int = 30
    """tasks of the built-in validation split for the specialisation's regression check."""
    spec_verify_edits: int = 8
    """the specialisation's evaluations: attempts per edit turn checked against the request's
    failing test (SpecialiseConfig.verify_edits; 0: one greedy attempt). 8, as `etude
    specialise` defaults to: chosen on the select slice (bench/results/specialise_select.json)."""
    org_history: str = "tinydb==4.8.2..4.9.0"
    """the organisation's code with a past and a future, for the specialisation by time (stage 5):
    a PyPI release pair NAME==OLD..NEW, a local git repository or a builtin:history name."""
    org_until: str = "4.8.2"
    """its cut-off: a revision (for a release pair, its older release) or YYYY-MM-DD."""
    time_minutes: float = 4.0
    """the specialisation by time's training budget (LoRA on the cut-off's text), wall minutes."""
    time_items: int = 200
    """held-out lines (written after the cut-off) it is measured on."""
    full: bool = False
    """also the agent-level specialisation on held-out functions (stage 5b, `etude specialise`
    without --until: 70.8 minutes of the 106.5-minute demo of 2026-12-06); its adapter is then the
    org's candidate that the cycle canaries."""
    loop_config: str = "configs/loop_demo.toml"
    """the real-time cycle's config; model and root are set by the demo."""
    backend: str = "auto"
    """engine of the evaluations and of the RL rollouts: "hf", "vllm" (`make setup-vllm`; about
    2.3x faster episodes here) or "auto" (vllm when this Python environment has it)."""
    workers: int | None = None
    """episodes in flight in an evaluation: None = 8 with hf (on a local Ray), 16 with vllm."""
    seed: int = 0
    record: bool = False
    """also write bench/results/demo.json (the figures docs/demo.md quotes), with provenance."""
    extra: dict[str, Any] = field(default_factory=dict)


QUICK = DemoConfig(model="tiny", eval_tasks=2, sft_tasks=2, sft_epochs=1.0, org_repos="example", spec_minutes=1.5,
                   time_minutes=0.1, time_items=30,
                   spec_tasks_per_repo=16, spec_drills_per_repo=6, spec_min_heldout=2, spec_general_tasks=2,
                   loop_config="configs/loop_tiny.toml", backend="hf", workers=2)


def load_demo_config(path: str | Path, base: DemoConfig | None = None,
                     overrides: dict[str, Any] | None = None) -> DemoConfig:
    """`base` (default DemoConfig(); QUICK for --quick) with the TOML file's keys and then
    `overrides` (field -> value) on top. An unknown key or a value of the wrong type is one
    EtudeError naming the file."""
    start = dataclasses.asdict(base or DemoConfig())
    return load_with(lambda d: build(DemoConfig, {**start, **d}, ""), path, "demo config", overrides=overrides)
