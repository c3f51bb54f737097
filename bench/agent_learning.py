"""Does the agent learn to code? Base vs SFT vs SFT+RL on the curriculum's held-out test split.

One run, stage by stage (each stage resumes from its folder under --work if interrupted):
1. curriculum — the built-in level-1 split (train / validation / test from disjoint packages);
2. base       — `etude eval` of the base model on the held-out test split;
3. sft        — `etude sft` (configs/agent_sft.toml) on expert trajectories of the train split;
4. sft eval   — the SFT checkpoint on the same held-out tasks;
5. rl         — `etude train` (configs/agent_rl.toml): GRPO over whole episodes from the SFT
                checkpoint, on train-split tasks, validated on the validation split;
6. rl eval    — the RL checkpoint on the same held-out tasks;
7. analysis   — resolved rates with Wilson 95% intervals, exact McNemar p for SFT vs base and RL vs
                SFT on the paired tasks, behaviour (valid calls, parallel calls, turns, tokens),
                wall time per stage, targets met or missed, and plots.

    python bench/agent_learning.py [--sft-tasks 200] [--rl-steps 6] [--test-max N] [--skip-rl]

Writes bench/results/agent_learning.json and bench/results/agent_learning/*.png. Every number in
it is measured in the run that wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from etude.configfile import parse_set
from etude.envs.expert import gold_hunk
from etude.evals import EvalConfig, run_eval
from etude.evals.records import paired_outcomes, read_records, resolved_by_task
from etude.evals.stats import wilson_ci
from etude.evals.summary import behaviour
from etude.harness import HarnessConfig
from etude.harness.record import load_trajectory
from etude.tasks.curriculum import build, builtin_curriculum, members
from etude.train import load_config, train
from etude.train.checkpoint import latest_checkpoint
from etude.train.metrics import read_metrics
from etude.train.sft import load_sft_config, run_sft

TARGETS = {"valid_call_rate_sft": 0.95, "sft_resolved": 0.20, "rl_gain_points": 0.08, "rl_p": 0.05,
           "tokens_per_resolved_cut": 0.20}


def log(msg: str) -> None:
    print(f"[agent_learning {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def stage_figures(run: Path) -> dict[str, Any]:
    s = json.loads((run / "summary.json").read_text())
    res = resolved_by_task(run)
    k, n = sum(res.values()), len(res)
    lo, hi = wilson_ci(k, n)
    return {"resolved": k, "tasks": n, "resolved_rate": k / n if n else None, "ci95": [lo, hi],
            "resolved_rate_summary": s["correctness"]["resolved_rate"], "behaviour": s.get("behaviour"),
            "errors": s.get("errors"), "stop_reasons": (s.get("efficiency") or {}).get("stop_reasons"),
            "reward_mean": (s.get("reward") or {}).get("mean"), "habits": habits(run)}


def habits(run: Path) -> dict[str, Any]:
    """What the agent did around its edits, read from each held-out episode's trajectory: how
    often a re-run of the tests after an applied edit still failed, and whether the agent then
    edited again or stopped (the habit the expert's wrong-fix-first plans are there to teach);
    edit calls whose old_str equals new_str (refused by the tool); episodes that ended in `submit`.

    `funnel`: how far each episode got towards the gold fix, from the task's gold patch (its `-`
    lines are the buggy text in the workspace, its `+` lines the fix): a read_file output showed a
    buggy line; an edit_file's old_str held a buggy line; that edit's new_str held the fix line."""
    out = Counter()
    funnel = Counter()
    gold = gold_lines(run)
    for iid, rec in records(run).items():
        if rec.get("status") != "ok" or not rec.get("trajectory") or not (run / rec["trajectory"]).is_file():
            continue
        out["episodes"] += 1
        traj = load_trajectory(run / rec["trajectory"])
        if iid in gold:
            for k, v in funnel_steps(traj, *gold[iid]).items():
                funnel[k] += v
        edited = failed_after_edit = again = False
        for x in traj.tool_calls:
            name, args = x.call.name, x.call.arguments
            if name == "edit_file":
                out["edit_calls"] += 1
                out["noop_edit_calls"] += args.get("old_str") == args.get("new_str")
                again |= failed_after_edit
                edited |= x.result.ok
            elif name == "run_terminal" and "pytest" in str(args.get("command", "")) and edited:
                failed_after_edit |= (x.result.meta or {}).get("exit_code") not in (0, None) or not x.result.ok
        out["submitted"] += any(x.call.name == "submit" for x in traj.tool_calls)
        out["failed_rerun_after_edit"] += failed_after_edit
        out["edited_again_after_failed_rerun"] += again
        out["resolved_after_failed_rerun"] += failed_after_edit and bool(rec.get("resolved"))
    return dict(out) | {"funnel": dict(funnel)}


def gold_lines(run: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per task of the run with a one-hunk gold patch (`etude.envs.expert.gold_hunk`, as every
    level-1 task has), the stripped non-blank lines it removes and adds."""
    out = {}
    path = run / "tasks.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else ():
        t = json.loads(line)
        hunk = gold_hunk(t.get("patch") or "")
        minus = [r.strip() for r in hunk.old if r.strip()] if hunk else []
        plus = [r.strip() for r in hunk.new if r.strip()] if hunk else []
        if minus and plus:
            out[t["instance_id"]] = (minus, plus)
    return out


def funnel_steps(traj: Any, minus: list[str], plus: list[str]) -> dict[str, bool]:
    read = edited = fixed = False
    for x in traj.tool_calls:
        if x.call.name == "read_file" and x.result.ok:
            read |= any(m in (x.result.output or "") for m in minus)
        elif x.call.name == "edit_file":
            old, new = str(x.call.arguments.get("old_str", "")), str(x.call.arguments.get("new_str", ""))
            hit = any(m in old for m in minus)
            edited |= hit
            fixed |= hit and any(p in new for p in plus)
    return {"episodes": True, "read_buggy_line": read, "edited_buggy_line": edited, "edit_had_fix": fixed}


def records(run: Path) -> dict[str, dict[str, Any]]:
    return {iid: r for (iid, k), r in read_records(run / "results.jsonl").items() if k == 0}


def subset_figures(run: Path, ids: list[str]) -> dict[str, Any]:
    """Stage figures from the episodes of `ids` only (an evaluation stopped before the whole split)."""
    recs = records(run)
    k = sum(1 for i in ids if recs[i].get("status") == "ok" and recs[i].get("resolved"))
    lo, hi = wilson_ci(k, len(ids))
    eff = [(recs[i].get("efficiency") or {}) for i in ids]
    return {"resolved": k, "tasks": len(ids), "resolved_rate": k / len(ids), "ci95": [lo, hi],
            "behaviour": behaviour({i: [recs[i]] for i in ids}),
            "errors": sum(1 for i in ids if recs[i].get("status") != "ok"),
            "stop_reasons": dict(Counter(e.get("stop_reason") for e in eff)),
            "reward_mean": statistics.fmean(float((recs[i].get("reward") or {}).get("total", 0.0)) for i in ids)}


def evaluate(tasks: list, model: str, out: Path, hc: HarnessConfig, workers: int, backend: str = "hf") -> float:
    t0 = time.time()
    # threads: every stage on the same executor (Ray adds actor hops and runs fewer episodes per
    # second on 2 cores, bench/ray_episodes.py)
    cfg = EvalConfig(workers=workers, executor="threads", harness=hc, report=False, progress=True, bootstrap=500,
                     backend=backend)
    run_eval(tasks, model, out, cfg)
    return time.time() - t0


def plots(out_dir: Path, stages: dict[str, Any], sft_dir: Path, rl_dir: Path | None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    names = [s for s in ("base", *sorted(k for k in stages if k.startswith("earlier_sft")), "previous_sft", "sft",
                         "previous_rl", "rl")
             if s in stages]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    rates = [stages[s]["resolved_rate"] * 100 for s in names]
    err = [[r - stages[s]["ci95"][0] * 100 for s, r in zip(names, rates, strict=True)],
           [stages[s]["ci95"][1] * 100 - r for s, r in zip(names, rates, strict=True)]]
    colours = {"base": "#999", "previous_sft": "#9c8", "sft": "#4a7", "previous_rl": "#9bd", "rl": "#37b"}
    colours.update({k: "#bdb" for k in names if k.startswith("earlier_sft")})
    ax.bar(names, rates, yerr=err, capsize=6, color=[colours[s] for s in names])
    ax.set_ylabel("held-out resolved (%)")
    ax.set_title(f"level-1 held-out tasks (n={stages['base']['tasks']}), Wilson 95%")
    fig.tight_layout()
    fig.savefig(out_dir / "resolved.png", dpi=120)
    files.append(str(out_dir / "resolved.png"))
    plt.close(fig)
    sft = [r for r in read_metrics(sft_dir) if r.get("kind") == "train"]
    if sft:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot([r["step"] for r in sft], [r["loss"] for r in sft])
        ax.set_xlabel("SFT step")
        ax.set_ylabel("loss (assistant tokens)")
        fig.tight_layout()
        fig.savefig(out_dir / "sft_loss.png", dpi=120)
        files.append(str(out_dir / "sft_loss.png"))
        plt.close(fig)
    if rl_dir is not None and (rl_dir / "metrics.jsonl").is_file():
        recs = read_metrics(rl_dir)
        tr = [r for r in recs if r.get("kind") == "train"]
        ev = [r for r in recs if r.get("kind") == "eval"]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        axes[0].plot([r["step"] for r in tr], [r["reward"] for r in tr], marker="o")
        axes[0].set_title("train reward")
        axes[1].plot([r["step"] for r in ev], [r["eval/resolved"] for r in ev], marker="o")
        axes[1].set_title("validation resolved")
        axes[2].plot([r["step"] for r in tr], [r.get("monitor/tokens", 0) for r in tr], marker="o")
        axes[2].set_title("tokens per episode")
        for a in axes:
            a.set_xlabel("RL step")
        fig.tight_layout()
        fig.savefig(out_dir / "rl_curves.png", dpi=120)
        files.append(str(out_dir / "rl_curves.png"))
        plt.close(fig)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/agent_learning")
    ap.add_argument("--out", default="bench/results/agent_learning.json")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--sft-config", default="configs/agent_sft.toml")
    ap.add_argument("--rl-config", default="configs/agent_rl.toml")
    ap.add_argument("--sft-tasks", type=int, default=None, help="train-split tasks for expert trajectories")
    ap.add_argument("--sft-epochs", type=float, default=None)
    ap.add_argument("--sft-init", default=None,
                    help="start SFT from this checkpoint instead of --model (a second SFT stage); the base "
                         "evaluation is still of --model")
    ap.add_argument("--sft-model", default=None, metavar="DIR",
                    help="an SFT model trained elsewhere (bench/gpu_sft.py merge writes one, with summary.json and "
                         "metrics.jsonl beside it): evaluated as the SFT stage instead of running `etude sft` here")
    ap.add_argument("--sft-lr", type=float, default=None)
    ap.add_argument("--sft-seed", type=int, default=None,
                    help="the expert's plan variations and the SFT order (a later stage on new variations)")
    ap.add_argument("--previous-sft", default=None, metavar="EVAL_DIR",
                    help="the held-out evaluation of the stage --sft-init came from (its eval-sft folder): its "
                         "figures and a paired test against this SFT stage join the results (same tasks and "
                         "harness, checked)")
    ap.add_argument("--earlier-sft", action="append", default=[], metavar="EVAL_DIR",
                    help="an eval-sft folder of a stage before --previous-sft (repeatable): its figures and a "
                         "paired test against this stage join the results as earlier_sft_N (same checks)")
    ap.add_argument("--previous-rl", default=None, metavar="EVAL_DIR",
                    help="the held-out evaluation of an earlier RL run from the same SFT stage (its eval-rl folder, "
                         "e.g. with another reward): its figures and a paired test against this RL stage join the "
                         "results as previous_rl (same checks)")
    ap.add_argument("--rl-steps", type=int, default=None)
    ap.add_argument("--test-max", type=int, default=None)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--eval-backend", default="hf", choices=("hf", "vllm"),
                    help="engine of the held-out evaluations (vllm: run under .venv-vllm, `make setup-vllm`)")
    ap.add_argument("--eval-temperature", type=float, default=0.0,
                    help="sampling temperature of the held-out evaluations (0 = greedy, pass@1)")
    ap.add_argument("--skip-rl", action="store_true")
    ap.add_argument("--no-split", default="munch==4.0.0,pyhumps==3.8.0,ordered-set==4.1.0",
                    help="packages in no split of the built-in curriculum: every stage is also evaluated on "
                         "their level-1 tasks ('' to skip)")
    ap.add_argument("--no-split-max", type=int, default=24)
    ap.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the RL config (as `etude train --set`), e.g. eval_problems=8")
    ap.add_argument("--analyse-only", action="store_true",
                    help="run nothing: read the stages' results under --work and analyse the held-out tasks that "
                         "every stage finished (for a run stopped before the whole split)")
    args = ap.parse_args()
    if args.analyse_only:
        analyse_only(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    t0 = time.time()

    log("curriculum: held-out test split")
    ts = time.time()
    split = {"test": builtin_curriculum("test", 1)}
    walls["curriculum_s"] = time.time() - ts
    test = split["test"][: args.test_max] if args.test_max else split["test"]
    sft_cfg = load_sft_config(args.sft_config, {"model": args.sft_init or args.model,
                                                **({"max_tasks": args.sft_tasks} if args.sft_tasks else {}),
                                                **({"epochs": args.sft_epochs} if args.sft_epochs else {}),
                                                **({"lr": args.sft_lr} if args.sft_lr else {}),
                                                **({"seed": args.sft_seed} if args.sft_seed is not None else {})})
    # Every stage is evaluated with the harness SFT trains on, greedy by default (pass@1).
    hc = sft_cfg.harness_config().replace(temperature=args.eval_temperature)

    stages: dict[str, Any] = {}
    log(f"base eval on {len(test)} held-out tasks")
    walls["base_eval_s"] = evaluate(test, args.model, work / "eval-base", hc, args.workers, args.eval_backend)
    stages["base"] = stage_figures(work / "eval-base")

    log("sft")
    ts = time.time()
    sft_dir = work / "sft"
    if args.sft_model:  # trained on another machine (bench/gpu_sft.py): its figures come with it
        sft_dir = Path(args.sft_model).parent
        try:
            sft = {**json.loads((sft_dir / "summary.json").read_text()), "final": args.sft_model}
        except (OSError, ValueError):
            raise SystemExit(f"--sft-model {args.sft_model}: no readable summary.json beside it") from None
    else:
        sft = run_sft(sft_cfg, sft_dir)
    walls["sft_s"] = time.time() - ts
    log("sft eval")
    walls["sft_eval_s"] = evaluate(test, sft["final"], work / "eval-sft", hc, args.workers, args.eval_backend)
    stages["sft"] = stage_figures(work / "eval-sft")

    def join(name: str, flag: str, d: str) -> None:
        """Another run's held-out evaluation joins the results (same tasks and harness, checked)."""
        prev = Path(d)
        theirs = json.loads((prev / "run.json").read_text()).get("config", {}).get("harness")
        ours = json.loads((work / "eval-sft" / "run.json").read_text()).get("config", {}).get("harness")
        defaults = HarnessConfig().to_dict()  # a run from before a field existed ran with its default
        theirs, ours = ({**defaults, **h} if isinstance(h, dict) else h for h in (theirs, ours))
        if theirs != ours or set(resolved_by_task(prev)) != set(resolved_by_task(work / "eval-sft")):
            raise SystemExit(f"{flag} {prev}: not the same held-out tasks and harness as this run")
        stages[name] = stage_figures(prev)
        stages[name]["eval_dir"] = str(prev)

    earlier = {"previous_sft": args.previous_sft} if args.previous_sft else {}
    earlier.update({f"earlier_sft_{i + 1}": d for i, d in enumerate(args.earlier_sft)})
    for name, d in earlier.items():
        join(name, f"--{name.split('_sft')[0]}-sft", d)
    if args.previous_rl:
        join("previous_rl", "--previous-rl", args.previous_rl)

    rl_dir = None
    if not args.skip_rl:
        log("rl")
        over: dict[str, Any] = {"model": sft["final"], **parse_set(args.rl_set)}
        if args.rl_steps:
            over["steps"] = args.rl_steps
        rl_cfg = load_config(args.rl_config, over)
        ts = time.time()
        rl_dir = work / "rl"
        res = train(rl_cfg, rl_dir)
        walls["rl_s"] = time.time() - ts
        ckpt = latest_checkpoint(rl_dir) or Path(res["checkpoint"])
        log("rl eval")
        walls["rl_eval_s"] = evaluate(test, str(ckpt), work / "eval-rl", hc, args.workers, args.eval_backend)
        stages["rl"] = stage_figures(work / "eval-rl")
        stages["rl"]["checkpoint"] = str(ckpt)
        tr = [r for r in read_metrics(rl_dir) if r.get("kind") == "train"]
        # rl_s is this process's time; a resumed RL stage did its steps in an earlier one
        walls["rl_steps_s_summed"] = sum(float(r.get("step_s", 0.0)) for r in tr)
        stages["rl"]["train"] = {"steps": len(tr), "groups_skipped": sum(r.get("groups_skipped", 0) for r in tr),
                                 "groups": sum(r.get("samples", 0) for r in tr) // max(1, rl_cfg.group_size),
                                 "reward_by_step": [r["reward"] for r in tr],
                                 "patch_similarity_by_step": [r.get("reward/patch_similarity") for r in tr],
                                 "step_s": [r.get("step_s") for r in tr], "gen_s": [r.get("gen_s") for r in tr],
                                 "alarms": sum(1 for r in read_metrics(rl_dir) if r.get("alarm/reward_up_val_down"))}

    no_split: dict[str, Any] = {}
    if args.no_split:
        specs = [x.strip() for x in args.no_split.split(",") if x.strip()]
        clash = {x.split("==")[0] for x in specs} & {m.spec.split("==")[0] for s_ in ("train", "validation", "test")
                                                      for m in members(s_)}
        if clash:
            raise SystemExit(f"--no-split names packages of the built-in split: {sorted(clash)}")
        extra = build(specs, 1, args.no_split_max)
        models = {"base": args.model, "sft": sft["final"], **({"rl": stages["rl"]["checkpoint"]} if "rl" in stages else {})}
        for name, m in models.items():
            log(f"no-split eval: {name}")
            walls[f"no_split_{name}_eval_s"] = evaluate(extra, m, work / f"nosplit-{name}", hc, args.workers, args.eval_backend)
            no_split[name] = stage_figures(work / f"nosplit-{name}")
        no_split["packages"] = specs
        no_split["sft_vs_base"] = paired_outcomes(work / "nosplit-base", work / "nosplit-sft")
        if "rl" in models:
            no_split["rl_vs_sft"] = paired_outcomes(work / "nosplit-sft", work / "nosplit-rl")

    log("curriculum: the whole train and validation splits (for the record)")
    ts = time.time()
    split.update({s: builtin_curriculum(s, 1) for s in ("train", "validation")})
    walls["curriculum_s"] += time.time() - ts
    comparisons = {"sft_vs_base": paired_outcomes(work / "eval-base", work / "eval-sft")}
    for name, d in earlier.items():
        comparisons[f"sft_vs_{name}"] = paired_outcomes(Path(d), work / "eval-sft")
    if "rl" in stages:
        comparisons["rl_vs_sft"] = paired_outcomes(work / "eval-sft", work / "eval-rl")
        comparisons["rl_vs_base"] = paired_outcomes(work / "eval-base", work / "eval-rl")
        if args.previous_rl:
            comparisons["rl_vs_previous_rl"] = paired_outcomes(Path(args.previous_rl), work / "eval-rl")
    b = stages["sft"]["behaviour"] or {}
    met = {
        "valid_call_rate_sft>=0.95": (b.get("valid_call_rate") or {}).get("mean") is not None
        and b["valid_call_rate"]["mean"] >= TARGETS["valid_call_rate_sft"],
        "sft_resolved>=0.20": stages["sft"]["resolved_rate"] >= TARGETS["sft_resolved"],
        "held_out>=100": len(test) >= 100,
    }
    if "rl" in stages:
        c = comparisons["rl_vs_sft"]
        met["rl>=sft+8pts_p<0.05"] = c["gain_points"] >= TARGETS["rl_gain_points"] and c["mcnemar_p"] < TARGETS["rl_p"]
        tps, tpr = (stages["sft"]["behaviour"] or {}).get("tokens_per_resolved"), (stages["rl"]["behaviour"] or {}).get("tokens_per_resolved")
        met["tokens_per_resolved_rl<=0.8*sft"] = bool(tps and tpr and tpr <= (1 - TARGETS["tokens_per_resolved_cut"]) * tps)
    walls["total_s"] = time.time() - t0
    result = {
        "bench": "agent_learning", "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                               "platform": platform.platform()},
        "model": args.model, "sft_init": args.sft_init,
        "split": {s: {"tasks": len(v), "packages": sorted({t.source.get("package", t.repo) for t in v})}
                  for s, v in split.items()},
        "held_out_tasks": len(test), "split_members": {s: [m.spec for m in members(s)] for s in split},
        "harness": hc.to_dict(), "sft": {k: sft.get(k) for k in ("steps", "sequences", "trajectories", "train_tokens",
                                                                 "loss_tokens", "gather_s", "train_s", "final",
                                                                 "trained_on", "adapter") if k in sft},
        "stages": stages, "comparisons": comparisons, "no_split": no_split, "targets": TARGETS, "targets_met": met,
        "wall_s": walls,
    }
    result["plots"] = plots(Path(args.out).with_suffix(""), stages, sft_dir, rl_dir)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {args.out}")
    print(json.dumps({"stages": {k: (v["resolved"], v["tasks"], v["ci95"]) for k, v in stages.items()},
                      "comparisons": comparisons, "targets_met": met, "wall_s": walls}, indent=1))


def analyse_only(args: argparse.Namespace) -> None:
    work = Path(args.work)
    test = builtin_curriculum("test", 1)
    runs = {n: work / f"eval-{n}" for n in ("base", "sft", "rl") if (work / f"eval-{n}" / "results.jsonl").is_file()}
    done = [{i for i, r in records(p).items() if r.get("status") == "ok"} for p in runs.values()]
    ids = [t.instance_id for t in test if all(t.instance_id in d for d in done)]
    stages = {n: subset_figures(p, ids) for n, p in runs.items()}
    comparisons = {"sft_vs_base": paired_outcomes(runs["base"], runs["sft"], ids)}
    if "rl" in runs:
        comparisons["rl_vs_sft"] = paired_outcomes(runs["sft"], runs["rl"], ids)
    sft = json.loads((work / "sft" / "summary.json").read_text())
    b = stages["sft"]["behaviour"]
    met = {"valid_call_rate_sft>=0.95": b["valid_call_rate"]["mean"] is not None
           and b["valid_call_rate"]["mean"] >= TARGETS["valid_call_rate_sft"],
           "sft_resolved>=0.20": stages["sft"]["resolved_rate"] >= TARGETS["sft_resolved"],
           "held_out>=100": len(ids) >= 100}
    if "rl" not in runs:
        met["rl>=sft+8pts_p<0.05"] = False
        met["tokens_per_resolved_rl<=0.8*sft"] = False
    walls = {n: sum(float(r.get("episode_s", 0)) for r in records(p).values()) for n, p in runs.items()}
    split = {s: builtin_curriculum(s, 1) for s in ("train", "validation", "test")}
    result = {
        "bench": "agent_learning", "mode": "analyse-only (stages run by bench/agent_learning.py; the evaluations "
        "were stopped before the whole test split, so only the held-out tasks every stage finished are counted)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "model": args.model, "sft_init": args.sft_init,
        "split": {k: {"tasks": len(v), "packages": sorted({t.source.get("package", t.repo) for t in v})}
                  for k, v in split.items()},
        "held_out_tasks": len(ids), "held_out_split_size": len(test),
        "held_out_packages": dict(Counter(next(t.source.get("package") for t in test if t.instance_id == i) for i in ids)),
        "sft": {k: sft.get(k) for k in ("steps", "sequences", "trajectories", "train_tokens", "loss_tokens",
                                        "gather_s", "train_s", "final", "last")},
        "stages": stages, "comparisons": comparisons, "targets": TARGETS, "targets_met": met,
        "episode_seconds_summed": walls, "rl": "not run in this bench run" if "rl" not in runs else "run",
    }
    result["plots"] = plots(Path(args.out).with_suffix(""), stages, work / "sft", work / "rl" if "rl" in runs else None)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"held_out_tasks": len(ids), "stages": {k: (v["resolved"], v["tasks"], v["ci95"])
                      for k, v in stages.items()}, "comparisons": comparisons, "targets_met": met}, indent=1))


if __name__ == "__main__":
    main()
