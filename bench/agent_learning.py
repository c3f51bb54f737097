"""Does the agent learn to code? Base vs SFT vs SFT+RL on the curriculum's held-out test split.

A thin caller of the one learning pipeline (etude.pipeline.learning, the stages `etude demo` runs
too): every stage is resumable under --work (a rerun reads finished stages back; a stage runs
again only when a config field it uses changed, or a stage it reads was redone):
1. tasks      — the built-in level-1 test split (held out: packages no training stage sees);
2. base       — `etude eval` of the base model on it;
3. sft        — `etude sft` (configs/agent_sft.toml) on expert trajectories of the train split;
4. sft eval   — the SFT checkpoint on the same held-out tasks;
5. rl         — `etude train` (configs/agent_rl.toml): GRPO over whole episodes from the SFT
                checkpoint, on train-split tasks, validated on the validation split;
6. rl eval    — the RL checkpoint on the same held-out tasks;
7-8. no split — every model on level-1 tasks of packages in no split of the curriculum;
then the analysis here: resolved rates with Wilson 95% intervals, exact McNemar p for SFT vs base
and RL vs SFT on the paired tasks (etude.pipeline.compare), behaviour (valid calls, parallel
calls, turns, tokens), what the agent did around its edits (`habits`), wall time per stage,
targets met or missed, and plots.

    python bench/agent_learning.py [--sft-tasks 200] [--rl-steps 6] [--test-max N] [--skip-rl]

Writes bench/results/agent_learning.json and agent_learning.records.jsonl (per-task outcomes of
every evaluation it summarises; its figures are recomputed by bench/verify.py) through
etude.evals.results.write_result, and bench/results/agent_learning/*.png. Every number in it is
measured in the run that wrote it.
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

from etude.envs.expert import gold_hunk
from etude.errors import EtudeError
from etude.evals.records import read_records, resolved_by_task
from etude.evals.results import write_result
from etude.evals.stats import wilson_ci
from etude.evals.summary import behaviour
from etude.harness import HarnessConfig
from etude.harness.record import load_trajectory
from etude.pipeline.compare import eval_records, paired_figures, paired_runs
from etude.pipeline.learning import (
    BASE_EVAL,
    NO_SPLIT_EVAL,
    NO_SPLIT_TASKS,
    RL,
    RL_EVAL,
    TASKS,
    WARM_EVAL,
    WARM_START,
    LearningConfig,
    eval_harness,
    run_learning,
)
from etude.provenance import provenance
from etude.tasks.curriculum import builtin_curriculum, members
from etude.train.metrics import read_metrics

TARGETS = {"valid_call_rate_sft": 0.95, "sft_resolved": 0.20, "rl_gain_points": 0.08, "rl_p": 0.05,
           "tokens_per_resolved_cut": 0.20}


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


def harness_of(run: Path) -> Any:
    """The harness an evaluation ran with (its run.json); a field added since, at its default."""
    h = json.loads((run / "run.json").read_text()).get("config", {}).get("harness")
    return {**HarnessConfig().to_dict(), **h} if isinstance(h, dict) else h


def join_check(flag: str, d: str, harness: dict[str, Any]) -> None:
    """Before any stage runs: an earlier run's held-out evaluation named on the command line is
    one, with this run's harness (its tasks are checked by `joined`, once this run has its own)."""
    if not (Path(d) / "run.json").is_file() or not (Path(d) / "results.jsonl").is_file():
        raise SystemExit(f"{flag} {d}: not an evaluation folder (no run.json and results.jsonl)")
    if harness_of(Path(d)) != {**HarnessConfig().to_dict(), **harness}:
        raise SystemExit(f"{flag} {d}: not the same harness as this run")


def joined(work: Path, flag: str, d: str) -> dict[str, Any]:
    """Another run's held-out evaluation joins the results (same tasks and harness, checked)."""
    prev = Path(d)
    if harness_of(prev) != harness_of(work / "eval-sft") or \
            set(resolved_by_task(prev)) != set(resolved_by_task(work / "eval-sft")):
        raise SystemExit(f"{flag} {prev}: not the same held-out tasks and harness as this run")
    return stage_figures(prev) | {"eval_dir": str(prev)}


def result_figures(arms: dict[str, Path], pairs: list[tuple[str, str]],
                   no_split: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The result file's figures (etude.evals.results): each arm's resolved rate and each pair's
    paired comparison on the held-out split (`heldout.B_vs_A`, the keys of `comparisons`), tool
    use of SFT vs base, and the same on the no-split tasks (`no_split.B_vs_A`)."""
    figs: dict[str, dict[str, Any]] = {}
    for b, a in pairs:
        figs |= paired_figures("heldout", a, b)
    figs["heldout.sft_vs_base.tool_use"] = {"kind": "paired", "a": {"arm": "base"}, "b": {"arm": "sft"},
                                            "key": "task", "field": "tool_use"}
    for b, a in no_split:
        figs |= {k.replace("nosplit-", ""): v for k, v in
                 paired_figures("no_split", f"nosplit-{a}", f"nosplit-{b}").items()}
    return {k: v for k, v in figs.items() if all(sel.get("arm") in arms for sel in (v.get("of"), v.get("a"), v.get("b"))
                                                if sel is not None)}


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
    ap.add_argument("--no-split", default="",
                    help="packages in no split of the built-in curriculum, comma-separated: every stage is also "
                         "evaluated on their level-1 tasks (default none: munch, pyhumps and ordered-set, the ones "
                         "earlier runs used, are in the validation split since the test split was sealed)")
    ap.add_argument("--no-split-max", type=int, default=24)
    ap.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the RL config (as `etude train --set`), e.g. eval_problems=8")
    ap.add_argument("--analyse-only", action="store_true",
                    help="run nothing: read the stages' results under --work and analyse the held-out tasks that "
                         "every stage finished (for a run stopped before the whole split)")
    args = ap.parse_args()
    if not args.out.endswith(".json"):
        raise SystemExit(f"--out {args.out}: a result file is NAME.json (its records go beside it)")
    try:
        if args.analyse_only:
            analyse_only(args)
        else:
            run(args)
    except EtudeError as e:
        raise SystemExit(f"agent_learning: {e}") from None


def run(args: argparse.Namespace) -> None:
    t0 = time.time()
    cfg = LearningConfig(out=args.work, model=args.model, sft_config=args.sft_config, rl_config=args.rl_config,
                         sft_tasks=args.sft_tasks, sft_epochs=args.sft_epochs, sft_init=args.sft_init,
                         sft_model=args.sft_model, sft_lr=args.sft_lr, sft_seed=args.sft_seed, rl_steps=args.rl_steps,
                         rl_set=tuple(args.rl_set), test_max=args.test_max, workers=args.workers,
                         eval_backend=args.eval_backend, eval_temperature=args.eval_temperature, skip_rl=args.skip_rl,
                         no_split=tuple(x.strip() for x in args.no_split.split(",") if x.strip()),
                         no_split_max=args.no_split_max)
    earlier = {"previous_sft": args.previous_sft} if args.previous_sft else {}
    earlier.update({f"earlier_sft_{i + 1}": d for i, d in enumerate(args.earlier_sft)})
    flags = {name: f"--{name.split('_sft')[0].replace('_', '-')}-sft" for name in earlier}
    harness = eval_harness(cfg.sft_config, cfg.eval_temperature).to_dict()  # every evaluation's
    for name, d in earlier.items():
        join_check(flags[name], d, harness)
    if args.previous_rl:
        join_check("--previous-rl", args.previous_rl, harness)

    ln = run_learning(cfg)  # stages 1-8 (etude.pipeline.learning)
    work, st = ln.out, ln.stages
    secs = {k: v["seconds"] for k, v in st.times().items()}
    test = st.result(TASKS)["test"]
    sft = st.result(WARM_START)
    stages: dict[str, Any] = {"base": stage_figures(work / "eval-base"), "sft": stage_figures(work / "eval-sft")}
    for name, d in earlier.items():
        stages[name] = joined(work, flags[name], d)
    if args.previous_rl:
        stages["previous_rl"] = joined(work, "--previous-rl", args.previous_rl)
    walls = {"curriculum_s": secs[TASKS], "base_eval_s": secs[BASE_EVAL], "sft_s": secs[WARM_START],
             "sft_eval_s": secs[WARM_EVAL]}
    rl_dir = None
    if not cfg.skip_rl:
        rl_dir = work / "rl"
        rl = st.result(RL)
        stages["rl"] = stage_figures(work / "eval-rl") | {"checkpoint": rl["checkpoint"], "train": rl["train"]}
        walls |= {"rl_s": secs[RL], "rl_eval_s": secs[RL_EVAL], "rl_steps_s_summed": rl["steps_s_summed"]}

    runs = {"base": work / "eval-base", "sft": work / "eval-sft", **{n: Path(d) for n, d in earlier.items()},
            **({"rl": work / "eval-rl"} if "rl" in stages else {}),
            **({"previous_rl": Path(args.previous_rl)} if args.previous_rl else {})}
    pairs = [("sft", "base"), *(("sft", n) for n in earlier), ("rl", "sft"), ("rl", "base"), ("rl", "previous_rl")]
    comparisons = paired_runs(runs, pairs)

    no_split: dict[str, Any] = {}
    ns_pairs = [("sft", "base"), ("rl", "sft")]
    if cfg.no_split:
        models = ln.models()
        for name in models:
            walls[f"no_split_{name}_eval_s"] = secs[NO_SPLIT_EVAL + name]
            no_split[name] = stage_figures(work / f"nosplit-{name}")
        no_split["packages"] = list(cfg.no_split)
        no_split |= paired_runs({n: work / f"nosplit-{n}" for n in models}, ns_pairs)
        walls["curriculum_s"] += secs[NO_SPLIT_TASKS]

    # the whole train and validation splits, for the record (cached: built by the SFT and RL stages)
    ts = time.time()
    split = {s: builtin_curriculum(s, 1, use="build") for s in ("train", "validation", "test")}
    walls["curriculum_s"] += time.time() - ts
    met = targets_met(stages, comparisons, len(test))
    walls["total_s"] = time.time() - t0
    arms = {**runs, **{f"nosplit-{n}": work / f"nosplit-{n}" for n in no_split if n in ("base", "sft", "rl")}}
    meta = {
        "bench": "agent_learning", "machine": machine(), "model": args.model, "sft_init": args.sft_init,
        "split": {s: {"tasks": len(v), "packages": sorted({t.source.get("package", t.repo) for t in v})}
                  for s, v in split.items()},
        "held_out_tasks": len(test), "split_members": {s: [m.spec for m in members(s)] for s in split},
        "harness": ln.setup.harness.to_dict(),
        "sft": {k: sft.get(k) for k in ("steps", "sequences", "trajectories", "train_tokens", "loss_tokens", "gather_s",
                                        "train_s", "final", "trained_on", "adapter") if k in sft},
        "stages": stages, "comparisons": comparisons, "no_split": no_split, "targets": TARGETS, "targets_met": met,
        "wall_s": walls, "stage_times": st.times(),
        "plots": plots(Path(args.out).with_suffix(""), stages, Path(sft["final"]).parent if args.sft_model else work / "sft",
                       rl_dir),
    }
    prov = provenance(seeds={"curriculum": 0, "sft": ln.sft_cfg.seed}, started=t0, stages=st.times())
    write_result(args.out, result_figures(arms, pairs, ns_pairs), eval_records(arms), prov, meta=meta)
    print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps({"stages": {k: (v["resolved"], v["tasks"], v["ci95"]) for k, v in stages.items()},
                      "comparisons": comparisons, "targets_met": met, "wall_s": walls}, indent=1))


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def targets_met(stages: dict[str, Any], comparisons: dict[str, Any], held_out: int,
                missed_without_rl: bool = False) -> dict[str, bool]:
    """Each target (TARGETS) met or missed; without an RL stage, RL's are left out (or, with
    `missed_without_rl`, missed)."""
    b = stages["sft"]["behaviour"] or {}
    vc = (b.get("valid_call_rate") or {}).get("mean")
    met = {"valid_call_rate_sft>=0.95": vc is not None and vc >= TARGETS["valid_call_rate_sft"],
           "sft_resolved>=0.20": stages["sft"]["resolved_rate"] >= TARGETS["sft_resolved"],
           "held_out>=100": held_out >= 100}
    if "rl" in stages:
        c = comparisons["rl_vs_sft"]
        met["rl>=sft+8pts_p<0.05"] = c["gain_points"] >= TARGETS["rl_gain_points"] and c["mcnemar_p"] < TARGETS["rl_p"]
        tps, tpr = b.get("tokens_per_resolved"), (stages["rl"]["behaviour"] or {}).get("tokens_per_resolved")
        met["tokens_per_resolved_rl<=0.8*sft"] = bool(tps and tpr and tpr <= (1 - TARGETS["tokens_per_resolved_cut"]) * tps)
    elif missed_without_rl:
        met["rl>=sft+8pts_p<0.05"] = False
        met["tokens_per_resolved_rl<=0.8*sft"] = False
    return met


def analyse_only(args: argparse.Namespace) -> None:
    t0 = time.time()
    work = Path(args.work)
    test = builtin_curriculum("test", 1, use="final")
    runs = {n: work / f"eval-{n}" for n in ("base", "sft", "rl") if (work / f"eval-{n}" / "results.jsonl").is_file()}
    if not {"base", "sft"} <= set(runs):
        raise SystemExit(f"--analyse-only: {work} holds no eval-base and eval-sft results")
    done = [{i for i, r in records(p).items() if r.get("status") == "ok"} for p in runs.values()]
    ids = [t.instance_id for t in test if all(t.instance_id in d for d in done)]
    stages = {n: subset_figures(p, ids) for n, p in runs.items()}
    pairs = [("sft", "base"), ("rl", "sft")]
    comparisons = paired_runs(runs, pairs, ids)
    sft = json.loads((work / "sft" / "summary.json").read_text())
    walls = {n: sum(float(r.get("episode_s", 0)) for r in records(p).values()) for n, p in runs.items()}
    split = {s: builtin_curriculum(s, 1, use="build") for s in ("train", "validation", "test")}
    meta = {
        "bench": "agent_learning", "mode": "analyse-only (stages run by bench/agent_learning.py; the evaluations "
        "were stopped before the whole test split, so only the held-out tasks every stage finished are counted)",
        "machine": machine(), "model": args.model, "sft_init": args.sft_init,
        "split": {k: {"tasks": len(v), "packages": sorted({t.source.get("package", t.repo) for t in v})}
                  for k, v in split.items()},
        "held_out_tasks": len(ids), "held_out_split_size": len(test),
        "held_out_packages": dict(Counter(next(t.source.get("package") for t in test if t.instance_id == i) for i in ids)),
        "sft": {k: sft.get(k) for k in ("steps", "sequences", "trajectories", "train_tokens", "loss_tokens",
                                        "gather_s", "train_s", "final", "last")},
        "stages": stages, "comparisons": comparisons, "targets": TARGETS,
        "targets_met": targets_met(stages, comparisons, len(ids), missed_without_rl=True),
        "episode_seconds_summed": walls, "rl": "not run in this bench run" if "rl" not in runs else "run",
        "plots": plots(Path(args.out).with_suffix(""), stages, work / "sft", work / "rl" if "rl" in runs else None),
    }
    keep = set(ids)  # the figures count the tasks every stage finished, as the stages above do
    recs = [r for r in eval_records(runs) if r["task"] in keep]
    write_result(args.out, result_figures(runs, pairs, []), recs, provenance(seeds={"curriculum": 0}, started=t0),
                 meta=meta)
    print(json.dumps({"held_out_tasks": len(ids), "stages": {k: (v["resolved"], v["tasks"], v["ci95"])
                      for k, v in stages.items()}, "comparisons": comparisons, "targets_met": meta["targets_met"]},
                     indent=1))


if __name__ == "__main__":
    main()
