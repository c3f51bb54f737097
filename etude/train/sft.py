"""`etude sft`: the supervised warm start on agent trajectories, rendered by the one renderer that
serving and RL use (`etude.policy.local.encode_conversation`), with the loss on assistant tokens
only (tool calls and final answers).

Read top to bottom in `run_sft`:
1. gather trajectories from the configured sources (etude.envs.sources: `expert`, `self`, `drill`,
   `production`), each cached under OUT/data/ as it is made;
2. turn each into one token sequence (etude.train.sft_tokens) — the prompt of every assistant turn is exactly what the
   harness would send the model at that turn, and its completion exactly what the model would
   have sampled (content + end-of-turn); turns whose prompts extend the previous sequence share
   it, so a 5-turn episode is one sequence, not five;
3. pack sequences into rows (first-fit decreasing, block-diagonal mask, restarting positions),
   mix sources by weight, train (etude.train.sft_train: AdamW, bf16 autocast, full weights or
   LoRA, the RL learner's optimiser step), checkpoint every
   `checkpoint_every` steps (weights as safetensors + optimizer + cursor), resume after a kill;
4. write OUT/final: a model directory every other command loads (`--model OUT/final`); a LoRA run
   is merged into the base weights there (etude.train.lora).

The config is etude.train.sft_config's; every name callers import from here still is here.

Not guaranteed: bit-identical continuation after resume with a different number of threads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etude.envs.sources import (
    drill_trajectories,
    expert_trajectories,
    load_policy,
    load_task_source,
    new_drill_tasks,
    production_samples,
    self_trajectories,
)
from etude.errors import EtudeError
from etude.tasks.seal import check_sources
from etude.toolcalls import text_format_of
from etude.train.metrics import MetricsWriter
from etude.train.sft_config import SOURCES, SFTConfig, SourcesConfig, load_sft_config, sft_config_from_dict
from etude.train.sft_tokens import Sequence_, conversation_sequences, mix, pack_rows, row_loss, sample_sequences
from etude.train.sft_train import SFTTrainer, lr_at
from etude.types import Task, Trajectory

__all__ = [
    "SOURCES", "SFTConfig", "SFTTrainer", "Sequence_", "SourcesConfig", "conversation_sequences",
    "drill_trajectories", "expert_trajectories", "gather", "load_policy", "load_sft_config", "load_task_source",
    "lr_at", "mix", "new_drill_tasks", "pack_rows", "production_sequences", "row_loss", "run_sft",
    "self_trajectories", "sft_config_from_dict",
]


def production_sequences(path: Path) -> list[Sequence_]:
    """Single-turn sequences from `etude distill` output with positive total reward."""
    return sample_sequences(production_samples(path), "production")


def gather(cfg: SFTConfig, out: Path, progress: Any = None,
           tool_format: str = "hermes") -> dict[str, list[Trajectory] | list[Sequence_]]:
    """Trajectories (expert, self, drill) and production sequences, per source, from cache or made now.
    `tool_format`: the trained model's text tool format (etude.toolcalls.text_format_of), which a
    `[harness] tool_format = "auto"` becomes, so the expert writes calls as the model will."""
    hc = cfg.harness_config()
    if hc.tool_format == "auto" and tool_format != "hermes":
        hc = dataclasses.replace(hc, tool_format=tool_format)
    pools: dict[str, Any] = {}
    w = cfg.sources
    tasks: list[Task] = []
    if w.expert > 0 or w.self > 0:
        tasks = load_task_source(cfg.tasks, cfg.level, cfg.max_tasks, use="train")
        if not tasks:
            raise EtudeError(f"no tasks in {cfg.tasks}")
    if w.expert > 0:
        pools["expert"] = expert_trajectories(tasks, hc, out / "data" / "expert.jsonl", seed=cfg.seed,
                                              workers=cfg.expert_workers,
                                              progress=progress and progress("expert episodes"))
    if w.self > 0:
        pools["self"] = self_trajectories(tasks, w.self_model or cfg.model, hc, out / "data" / "self.jsonl",
                                          k=w.self_k, seed=cfg.seed,
                                          progress=progress and progress("own episodes"))
    if w.production > 0:
        if not w.production_file:
            raise EtudeError("sources.production > 0 needs sources.production_file (from `etude distill`)")
        pools["production"] = production_sequences(Path(w.production_file))
    if w.drill > 0:
        spec = w.drill_tasks or cfg.tasks
        drill_tasks = new_drill_tasks(load_task_source(spec, cfg.level, None, seed=w.drill_seed, use="train",
                                                       where="sft sources.drill_tasks"), tasks)
        if not drill_tasks:
            raise EtudeError(f"sources.drill > 0 but {spec} has no tasks beyond the expert's")
        pools["drill"] = drill_trajectories(drill_tasks, hc, out / "data" / "drill.jsonl", seed=cfg.seed,
                                            workers=cfg.expert_workers, progress=progress and progress("fix drills"))
    return pools


def _finished(cfg: SFTConfig, out: Path) -> dict[str, Any] | None:
    """The summary of a finished run of this very config in `out` (its final model present)."""
    try:
        # a key the recorded run predates counts as its default (a new option does not void old runs)
        old = {**json.loads(json.dumps(SFTConfig().to_dict())), **json.loads((out / "config.json").read_text())}
        same = old == json.loads(json.dumps(cfg.to_dict()))
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not same or not (out / "final" / "config.json").is_file():
        return None
    return {**summary, "resumed_from_step": summary["steps"]}


def run_sft(cfg: SFTConfig, out_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Gather, tokenise, train (or resume) and export; returns a summary (also OUT/summary.json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress display (ours), not one per shard save
    out = Path(out_dir)
    w = cfg.sources
    contamination = check_sources([("sft tasks", cfg.tasks if (w.expert > 0 or w.self > 0) else None),
                                   ("sft sources.drill_tasks", (w.drill_tasks or cfg.tasks) if w.drill > 0 else None)],
                                  cfg.allow_test_split)
    out.mkdir(parents=True, exist_ok=True)
    if (done := _finished(cfg, out)) is not None:
        return done  # the same run, already finished: nothing to gather, train or export again
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    t0 = time.time()
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*cols, disable=not progress) as bar:
        def tracker(name: str) -> Callable[[int, int], None]:
            job = bar.add_task(name, total=None, info="")

            def update(done: int, total: int) -> None:
                bar.update(job, completed=done, total=total)
            return update

        trainer = SFTTrainer(cfg, out)
        pools = gather(cfg, out, tracker, text_format_of(trainer.tokenizer))
        gather_s = time.time() - t0
        seqs: dict[str, list[Sequence_]] = {}
        dropped = 0
        for src, items in pools.items():
            if src == "production":
                cand = list(items)
            else:
                cand = [s for tr in items for s in conversation_sequences(
                    trainer.tokenizer, tr.messages, src, tr.meta.get("untrained_turns") or ())]
            keep = [s for s in cand if len(s.ids) <= cfg.max_sequence_tokens and s.loss_tokens]
            dropped += len(cand) - len(keep)
            seqs[src] = keep
        weights = {"expert": cfg.sources.expert, "self": cfg.sources.self, "production": cfg.sources.production,
                   "drill": cfg.sources.drill}
        order = mix(seqs, weights, cfg.epochs, cfg.seed)
        steps = math.ceil(len(order) / cfg.batch_sequences)
        state = trainer.restore() or {"step": 0}
        metrics = MetricsWriter(out, resume_step=state["step"] if state["step"] else -1)
        job = bar.add_task("sft", total=steps, completed=state["step"], info="")
        last: dict[str, Any] = {}
        try:
            t_train = time.time()
            done = state["step"]
            for step in range(state["step"], steps):
                if cfg.time_limit_s is not None and step > state["step"] and time.time() - t0 >= cfg.time_limit_s:
                    break  # the budget is spent: save and export this step below
                batch = order[step * cfg.batch_sequences:(step + 1) * cfg.batch_sequences]
                ts = time.time()
                rec = trainer.step(batch, lr_at(cfg, step, steps))
                rec.update({"kind": "train", "step": step + 1, "step_s": time.time() - ts,
                            "tokens_per_s": rec["tokens"] / max(1e-9, time.time() - ts), "time": time.time()})
                metrics.write(rec)
                last = rec
                bar.update(job, completed=step + 1, info=f"loss {rec['loss']:.3f}")
                done = step + 1
                if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < steps:
                    trainer.save(step + 1, {"steps": steps})
            train_s = time.time() - t_train
        finally:
            metrics.close()
    if done:
        trainer.save(done, {"steps": steps})
    final = trainer.export()
    summary = {
        "out": str(out), "final": str(final), "steps": done, "planned_steps": steps,
        "resumed_from_step": state["step"] or None,
        "sequences": {s: len(v) for s, v in seqs.items()}, "trajectories": {s: len(v) for s, v in pools.items()},
        "dropped_too_long": dropped, "train_tokens": sum(len(s.ids) for s in order),
        "loss_tokens": sum(s.loss_tokens for s in order), "last": last,
        "gather_s": round(gather_s, 1), "train_s": round(train_s, 1),
        **({"adapter": str(out / "adapter")} if cfg.lora.enabled else {}),
        **({"contamination": contamination} if contamination else {}),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
