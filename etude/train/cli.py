"""`etude train --config FILE [--out DIR] [--set key=value ...]`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from etude.errors import EtudeError
from etude.scale.lowp import check_precision
from etude.train import distributed, load_config, train
from etude.train.config import with_rollout_backend
from etude.train.modelcheck import check_model, problems, to_json
from etude.train.overrides import ConfigOpt, OutOpt, SetOpt, TestSplitOpt, run_dir, run_overrides
from etude.train.sft_cli import register_sft


def register(app: typer.Typer) -> None:
    register_sft(app)
    register_model(app)

    @app.command("train")
    def train_cmd(
        config: ConfigOpt("training", "configs/tiny.toml"),
        out: OutOpt = None,
        set_: SetOpt("--set steps=3 --set loss.kl_coef=0.1") = None,
        fresh: Annotated[bool, typer.Option("--fresh", help="Start over: delete --out's checkpoints (default: resume).")] = False,
        nproc: Annotated[int, typer.Option("--nproc", help="Ranks on this machine: the learner is sharded with FSDP2 (gloo on CPU, NCCL on GPUs); rollouts on rank 0.")] = 1,
        backend: Annotated[str | None, typer.Option("--backend", help="Rollout engine: hf or vllm (sets rollout_backend; vllm samples in-process, so it also sets use_ray = false unless --set says otherwise; needs `make setup-vllm`).")] = None,
        allow_test_split: TestSplitOpt("Train or validate") = False,
    ) -> None:
        """Train a policy with RL (GRPO/PPO, importance-corrected); resumes from OUT's latest checkpoint."""
        overrides = run_overrides(set_, allow_test_split)
        if backend is not None:
            overrides = with_rollout_backend(overrides, backend)
        cfg = load_config(config, overrides)
        where = run_dir(out, config)
        if nproc != 1:
            _launch(cfg, nproc)
            return
        res = train(cfg, where, resume=not fresh)
        if res.get("rank", 0) != 0:
            return  # rank 0 reports for the run
        last = res["last"] or {}
        evals = res["evals"]
        print(json.dumps({
            "out": str(where), "steps": res["steps"], "checkpoint": res["checkpoint"],
            "resumed_from": res["resumed_from"], "reward": last.get("reward"),
            "eval_resolved": [e["eval/resolved"] for e in evals], "world_size": res.get("world_size", 1),
            **({"contamination": res["contamination"]} if res.get("contamination") else {}),
        }))


def _launch(cfg: Any, nproc: int) -> None:
    """`--nproc N`: check what can be checked once, then run this command on N ranks (torchrun)."""
    import sys

    if distributed.env_world_size() > 1:
        raise EtudeError("--nproc inside a torchrun launch: pass one or the other")
    distributed.check_nproc(nproc, cfg.parallel.backend)
    if cfg.lora.enabled:
        raise EtudeError("LoRA with --nproc > 1 is not supported: train the adapter in one process")
    dev = "cuda" if distributed.resolve_backend(cfg.parallel.backend) == "nccl" else (
        "cuda" if cfg.device == "cuda" else "cpu")
    check_precision(cfg.precision, dev)
    argv, skip = [], False
    for a in sys.argv[1:]:  # the same command without --nproc
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            argv.append(a)
    rc = distributed.launch(nproc, argv, cfg.parallel.backend)
    if rc:
        raise SystemExit(rc)


def register_model(app: typer.Typer) -> None:
    model_app = typer.Typer(help="Check a model directory before training or serving it.", no_args_is_help=True)
    app.add_typer(model_app, name="model")

    @model_app.command("check")
    def check_cmd(
        path: Annotated[str, typer.Argument(help="A Hugging Face model directory (config.json, safetensors, tokenizer).")],
        seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length of the memory estimate.")] = 4096,
        gpus: Annotated[int, typer.Option("--gpus", help="GPUs of the memory estimate (full fine-tuning is sharded over them).")] = 1,
        vllm_python: Annotated[str | None, typer.Option("--vllm-python", help="A Python with vLLM to ask (default: this environment's, else the checkout's .venv-vllm).")] = None,
        no_vllm: Annotated[bool, typer.Option("--no-vllm", help="Skip the vLLM check (it starts vLLM's registry, a few seconds).")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    ) -> None:
        """What works for this model in etude: config, weights, tokenizer, chat template with tools, tool-call parsing, LoRA targets, vLLM, MoE replay, memory. Exit 2 with one line per problem."""
        from rich.console import Console
        from rich.table import Table

        if seq_len <= 0 or gpus <= 0:
            raise EtudeError("--seq-len and --gpus must be positive")
        rows = check_model(path, seq_len=seq_len, gpus=gpus, vllm_python=vllm_python, vllm=not no_vllm)
        if as_json:
            print(json.dumps(to_json(rows), indent=1))
        else:
            t = Table(title=f"etude model check {path}")
            for col in ("check", "status", "detail"):
                t.add_column(col)
            colour = {"ok": "green", "problem": "red", "skipped": "yellow", "info": "cyan"}
            for r in rows:
                t.add_row(r.check, f"[{colour[r.status]}]{r.status}[/]", r.detail)
            Console().print(t)
        bad = problems(rows)
        if bad:
            raise EtudeError("\n".join(bad))
