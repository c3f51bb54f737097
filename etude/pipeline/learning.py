"""The general learning path, once: a held-out slice of the curriculum, the base model's
evaluation on it, the SFT warm start on the scripted expert's trajectories, its evaluation, agent
RL from the warm start and its evaluation. `etude demo` runs stages 1-4 (its own tasks stage, then
`run_warm_start`); `bench/agent_learning.py` runs all of them through `run_learning`. Every stage
goes through etude.pipeline.stages (resumable; each declares the config fields it reads and the
stages whose outputs it reads), and both callers lay their output folder out the same way:

    eval_slice.jsonl     the held-out tasks every model is evaluated on
    eval-base/           the base model's evaluation (`etude eval`)
    sft/                 the warm start (`etude sft`)
    eval-sft/            its evaluation
    rl/, eval-rl/        agent RL from the warm start (`etude train`) and its evaluation
    nosplit.jsonl,       run_learning: tasks of packages in no split of the built-in curriculum,
    nosplit-NAME/        and each model's evaluation on them

Paired comparisons of these folders are in etude.pipeline.compare.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from etude.configfile import parse_set
from etude.errors import EtudeError
from etude.evals import EvalConfig, run_eval
from etude.harness import HarnessConfig
from etude.pipeline.isolate import in_child
from etude.pipeline.stages import StageFn, Stages
from etude.tasks import save_tasks
from etude.tasks.curriculum import build, builtin_curriculum, members
from etude.train import TrainConfig, load_config, train
from etude.train.checkpoint import latest_checkpoint
from etude.train.metrics import read_metrics
from etude.train.sft import SFTConfig, load_sft_config, run_sft

# Stage names (what state files and reports show; the demo's figures are recorded under these).
TASKS = "1. tasks"
BASE_EVAL = "2. base evaluation"
WARM_START = "3. general warm start (SFT)"
WARM_EVAL = "4. warm-start evaluation"
RL = "5. agent RL"
RL_EVAL = "6. RL evaluation"
NO_SPLIT_TASKS = "7. no-split tasks"
NO_SPLIT_EVAL = "8. no-split evaluation: "  # + the model's name (base, sft, rl)

SLICE = "eval_slice.jsonl"
NO_SPLIT_SLICE = "nosplit.jsonl"


# ---------------------------------------------------------------- the stages' work, shared


@dataclass(frozen=True)
class EvalSetup:
    """How every held-out evaluation of one run is done: the same for each model it compares."""

    harness: HarnessConfig
    workers: int
    backend: str
    executor: str = "ray"
    bootstrap: int = 500
    report: bool = True
    max_tasks: int | None = None
    fresh_for_new_weights: bool = False
    """A stage that runs because its inputs changed: an evaluation its folder holds of other
    weights or another harness is started over, not refused (run_eval's argument)."""

    def config(self) -> EvalConfig:
        return EvalConfig(workers=self.workers, executor=self.executor, harness=self.harness,
                          bootstrap=self.bootstrap, backend=self.backend, report=self.report,
                          max_tasks=self.max_tasks)


def eval_harness(agent_config: str | Path, temperature: float = 0.0) -> HarnessConfig:
    """The harness the warm start trains with (the `[harness]` table of the agent's SFT config),
    sampled at `temperature` (0: greedy, pass@1) for held-out evaluations."""
    return load_sft_config(agent_config).harness_config().replace(temperature=temperature)


def evaluate(suite: str | Path, model: str, out: Path, setup: EvalSetup, *, use: str) -> tuple[dict[str, Any], str]:
    """`etude eval` of `model` on `suite` into `out`: its summary and a one-line account. `use`:
    what the figures are for (etude.tasks.seal.USES)."""
    s = run_eval(suite, model, out, setup.config(), use=use, fresh_for_new_weights=setup.fresh_for_new_weights)
    r = s["correctness"]["resolved_rate"]
    vc = (s.get("behaviour") or {}).get("valid_call_rate") or {}
    valid = f", valid calls {vc['mean']:.0%}" if vc.get("mean") is not None else ""
    return s, (f"resolved {r['mean']:.0%} of {s.get('tasks', '?')} tasks "
               f"[95% CI {r['ci_low']:.0%}–{r['ci_high']:.0%}]{valid} ({Path(model).name})")


def warm_start(cfg: SFTConfig, out: Path) -> tuple[dict[str, Any], str]:
    """`etude sft` with `cfg` into `out`: its result (`final` is the model) and a one-line account."""
    res = in_child(run_sft, cfg, out)  # its memory goes back to the system when it ends
    return res, (f"{res['steps']} steps on {res['trajectories'].get('expert', 0)} expert trajectories "
                 f"({res['train_tokens']} tokens), final loss {res['last'].get('loss', float('nan')):.3f}")


def trained_elsewhere(model: str | Path) -> tuple[dict[str, Any], str]:
    """A warm start trained on another machine (bench/gpu_sft.py merge writes the model with
    summary.json and metrics.jsonl beside it): its figures, with `final` the model."""
    model = Path(model)
    try:
        res = json.loads((model.parent / "summary.json").read_text())
    except (OSError, ValueError):
        raise EtudeError(f"{model}: no readable summary.json beside it") from None
    return {**res, "final": str(model)}, f"trained elsewhere: {model}"


def agent_rl(cfg: TrainConfig, out: Path) -> tuple[dict[str, Any], str]:
    """`etude train` with `cfg` into `out` (GRPO over whole episodes): the last checkpoint and what
    the steps did, read from out/metrics.jsonl."""
    res = in_child(train, cfg, out)
    ckpt = latest_checkpoint(out) or Path(res["checkpoint"])
    recs = read_metrics(out)
    tr = [r for r in recs if r.get("kind") == "train"]
    steps = {"steps": len(tr), "groups_skipped": sum(r.get("groups_skipped", 0) for r in tr),
             "groups": sum(r.get("samples", 0) for r in tr) // max(1, cfg.group_size),
             "reward_by_step": [r["reward"] for r in tr],
             "patch_similarity_by_step": [r.get("reward/patch_similarity") for r in tr],
             "step_s": [r.get("step_s") for r in tr], "gen_s": [r.get("gen_s") for r in tr],
             "alarms": sum(1 for r in recs if r.get("alarm/reward_up_val_down"))}
    # the stage's seconds are this process's; a resumed RL run did some steps in an earlier one
    summed = sum(float(r.get("step_s", 0.0)) for r in tr)
    return ({"checkpoint": str(ckpt), "train": steps, "steps_s_summed": summed},
            f"{len(tr)} GRPO steps, reward by step {', '.join(f'{r:.2f}' for r in steps['reward_by_step'])}")


def run_warm_start(st: Stages, out: Path, model: str, sft: StageFn, setup: EvalSetup, *,
                   uses: Mapping[str, tuple[str, ...] | None] | None = None) -> dict[str, Any]:
    """Stages 2-4 on OUT/eval_slice.jsonl (written by the caller's TASKS stage): the base model's
    evaluation, the warm start (`sft` runs or reads it: (result with `final`, summary)), and its
    evaluation. `uses`: per stage name, the config fields it reads (none: the whole config).
    Returns the warm start's result."""
    u = uses or {}
    suite = out / SLICE
    st.run(BASE_EVAL, lambda: evaluate(suite, model, out / "eval-base", setup, use="final"), uses=u.get(BASE_EVAL), after=(TASKS,))
    res = st.run(WARM_START, sft, uses=u.get(WARM_START))
    st.run(WARM_EVAL, lambda: evaluate(suite, res["final"], out / "eval-sft", setup, use="final"), uses=u.get(WARM_EVAL),
           after=(TASKS, WARM_START))
    return res


# ---------------------------------------------------------------- base -> SFT -> RL (bench/agent_learning.py)

@dataclass(frozen=True)
class LearningConfig:
    out: str = "runs/agent_learning"
    """every stage's folder (the layout in the module doc) and the stages' state.json."""
    model: str = "smollm2"
    """the base model: evaluated, and the warm start's start unless `sft_init`."""
    sft_config: str = "configs/agent_sft.toml"
    """the warm start's config; its [harness] is every evaluation's harness."""
    rl_config: str = "configs/agent_rl.toml"
    sft_tasks: int | None = None
    """train-split tasks for expert trajectories (None: the SFT config's)."""
    sft_epochs: float | None = None
    sft_init: str | None = None
    """start SFT from this checkpoint instead of `model` (a later SFT stage)."""
    sft_model: str | None = None
    """a warm start trained elsewhere (`trained_elsewhere`): evaluated instead of running SFT."""
    sft_lr: float | None = None
    sft_seed: int | None = None
    rl_steps: int | None = None
    rl_set: tuple[str, ...] = ()
    """KEY=VALUE overrides of the RL config (as `etude train --set`)."""
    test_max: int | None = None
    """the first N tasks of the held-out test split (None: all of it)."""
    workers: int = 8
    eval_backend: str = "hf"
    eval_temperature: float = 0.0
    skip_rl: bool = False
    no_split: tuple[str, ...] = ()
    """packages in no split of the built-in curriculum (NAME==VERSION): every model is also
    evaluated on their level-1 tasks."""
    no_split_max: int = 24

    def sft_overrides(self) -> dict[str, Any]:
        return {"model": self.sft_init or self.model,
                **({"max_tasks": self.sft_tasks} if self.sft_tasks else {}),
                **({"epochs": self.sft_epochs} if self.sft_epochs else {}),
                **({"lr": self.sft_lr} if self.sft_lr else {}),
                **({"seed": self.sft_seed} if self.sft_seed is not None else {})}

    def rl_overrides(self, model: str) -> dict[str, Any]:
        return {"model": model, **parse_set(list(self.rl_set)), **({"steps": self.rl_steps} if self.rl_steps else {})}


# What each stage reads: a rerun with another RL budget keeps the evaluations before it.
EVAL_USES = ("test_max", "sft_config", "eval_temperature", "eval_backend")
NO_SPLIT_USES = ("no_split", "no_split_max", "sft_config", "eval_temperature", "eval_backend")
SFT_USES = ("model", "sft_config", "sft_tasks", "sft_epochs", "sft_init", "sft_model", "sft_lr", "sft_seed")
RL_USES = ("rl_config", "rl_set", "rl_steps")
LEARNING_USES: dict[str, tuple[str, ...]] = {BASE_EVAL: EVAL_USES + ("model",), WARM_START: SFT_USES,
                                              WARM_EVAL: EVAL_USES}


class Learning:
    def __init__(self, cfg: LearningConfig, console: Console | None = None):
        split = {m.spec.split("==")[0] for s in ("train", "validation", "test") for m in members(s)}
        clash = {x.split("==")[0] for x in cfg.no_split} & split
        if clash:  # before anything is written
            raise EtudeError(f"no_split names packages of the built-in split: {sorted(clash)}")
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.sft_cfg = load_sft_config(cfg.sft_config, cfg.sft_overrides())
        if not cfg.skip_rl:  # a bad RL config is one line now, not after hours of SFT
            load_config(cfg.rl_config, cfg.rl_overrides(cfg.model))
        self.con = console or Console(stderr=True)  # stdout is the caller's
        self.stages = Stages(self.out, cfg, self.con)
        # every model is evaluated with the harness SFT trains on, greedy by default (pass@1); on
        # threads: Ray adds actor hops and runs fewer episodes per second on 2 cores (bench/ray_episodes.py)
        self.setup = EvalSetup(eval_harness(cfg.sft_config, cfg.eval_temperature), cfg.workers, cfg.eval_backend,
                               executor="threads", report=False)

    def tasks(self) -> tuple[dict[str, Any], str]:
        c = self.cfg
        test = builtin_curriculum("test", 1, use="final")  # read once, for this run's final figures
        test = test[: c.test_max] if c.test_max else test
        save_tasks(test, self.out / SLICE)
        return {"test": [t.instance_id for t in test]}, f"{len(test)} held-out tasks of the test split"

    def no_split_tasks(self) -> tuple[dict[str, Any], str]:
        c = self.cfg
        extra = build(list(c.no_split), 1, c.no_split_max)
        save_tasks(extra, self.out / NO_SPLIT_SLICE)
        return {"no_split": [t.instance_id for t in extra]}, f"{len(extra)} tasks of {len(c.no_split)} packages in no split"

    def sft(self) -> tuple[dict[str, Any], str]:
        if self.cfg.sft_model:
            return trained_elsewhere(self.cfg.sft_model)
        return warm_start(self.sft_cfg, self.out / "sft")

    def models(self) -> dict[str, str]:
        """The models this run has, by name (base, sft, rl; rl unless `skip_rl`)."""
        st = self.stages
        out = {"base": self.cfg.model}
        if st.done(WARM_START):
            out["sft"] = st.result(WARM_START)["final"]
        if st.done(RL) and not self.cfg.skip_rl:
            out["rl"] = st.result(RL)["checkpoint"]
        return out


def run_learning(cfg: LearningConfig, console: Console | None = None) -> Learning:
    """Every stage of the path (each resumable), in order; returns the run, whose `stages` hold
    each stage's result and seconds."""
    ln = Learning(cfg, console)
    st, out = ln.stages, ln.out
    st.run(TASKS, ln.tasks, uses=("test_max",))
    sft = run_warm_start(st, out, cfg.model, ln.sft, ln.setup, uses=LEARNING_USES)
    if not cfg.skip_rl:
        rl = st.run(RL, lambda: agent_rl(load_config(cfg.rl_config, cfg.rl_overrides(sft["final"])), out / "rl"),
                    uses=SFT_USES + RL_USES, after=(WARM_START,))
        st.run(RL_EVAL, lambda: evaluate(out / SLICE, rl["checkpoint"], out / "eval-rl", ln.setup, use="final"),
               uses=EVAL_USES, after=(TASKS, RL))
    if cfg.no_split:
        st.run(NO_SPLIT_TASKS, ln.no_split_tasks, uses=("no_split", "no_split_max"))
        model_stage = {"base": (), "sft": (WARM_START,), "rl": (RL,)}
        for name, model in ln.models().items():
            st.run(NO_SPLIT_EVAL + name, lambda m=model, n=name: evaluate(out / NO_SPLIT_SLICE, m, out / f"nosplit-{n}",
                                                                          ln.setup, use="final"),
                   uses=NO_SPLIT_USES + (("model",) if name == "base" else ()),
                   after=(NO_SPLIT_TASKS, *model_stage[name]))
    return ln
