"""Does specialising to one organisation's repositories help on its held-out functions?

Runs `etude specialise` (etude.pipeline.specialise, the same stages as the command and the demo)
for one organisation whose packages are in no built-in split, from the general warm-started
agent, then draws the budget curve: the adapter after a third, two thirds and all of its SFT steps
and after RL, each evaluated on the same held-out functions (paired with the base; p values
Holm-corrected over the curve's points, which are reported, never picked from: the adapter the
run ships was chosen on the select slice of train functions). Every evaluation verifies edits
(`--verify-edits 8`, HarnessConfig.verify_edits: an edit turn that leaves the request's failing
tests' files failing is undone and sampled again), base and adapter alike, as `etude specialise`
does by default; that choice was made on the select slice (bench/specialise_select.py). With
`--greedy-run DIR` (the same adapter evaluated with one greedy attempt) the greedy arms are added.

    python bench/specialise.py --base runs/general_sft/final \
        --repos click==8.1.7,webcolors==24.8.0 --org acme --out runs/bench_specialise

Writes bench/results/specialise.json (figures recomputable by bench/verify.py, targets,
provenance), specialise.records.jsonl (per-task outcomes of every evaluation it summarises) and
bench/results/specialise/*.png, through etude.evals.results.write_result.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from etude.evals.results import write_result
from etude.evals.stats import holm
from etude.pipeline.compare import eval_records, paired_figures, paired_table
from etude.pipeline.learning import eval_harness
from etude.pipeline.memory import PeakMemory
from etude.pipeline.specialise import EPISODE_USES, Specialise, SpecialiseConfig, run_specialise, sft_inputs
from etude.provenance import provenance
from etude.train.metrics import read_metrics

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "org": "str",
    "repos": "list",
    "base": "str",
    "split": "dict",
    "adapter": "dict",
    "heldout": "dict",
    "general": "dict",
    "budget_curve": "dict",
    "harness": "dict",
    "stages": "dict",
    "memory": "dict",
    "targets": "dict",
    "plots": "list",
    "heldout_role": "str",
}

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"heldout_gain_points": 0.10, "heldout_mcnemar_p": 0.05, "whole_run_minutes": 60, "adapter_mib": 20}




def sft_checkpoints(out: Path) -> list[tuple[int, Path, float]]:
    """(step, adapter checkpoint, cumulative training seconds) of every SFT checkpoint kept."""
    steps = {int(m.group(1)): p for p in (out / "sft" / "checkpoints").glob("step-*")
             if (m := re.match(r"step-(\d+)$", p.name)) and (p / "adapter_config.json").is_file()}
    recs = [r for r in read_metrics(out / "sft") if r.get("kind") == "train"]
    cum: dict[int, float] = {}
    t = 0.0
    for r in sorted(recs, key=lambda r: r["step"]):
        t += float(r.get("step_s", 0.0))
        cum[int(r["step"])] = t
    return [(s, steps[s], cum.get(s, float("nan"))) for s in sorted(steps)]


def curve(sp: Specialise, rep: dict[str, Any], fracs_sft: tuple[float, ...] | str | None = None) -> list[dict[str, Any]]:
    """Held-out evaluations of the adapter at several training budgets (see the module doc);
    `fracs_sft`: the fractions of the SFT steps to evaluate (default: 1/3 and 2/3 when the SFT
    adapter shipped, 1/2 when RL's did; () for none; "off": the shipped adapter alone)."""
    from etude.train.lora import merge_adapter_dir

    out = sp.out
    ckpts = sft_checkpoints(out)
    if not ckpts:
        return []
    total = ckpts[-1][0]
    chosen = json.loads((out / "state.json").read_text())["stages"]["5. choose"]["result"]
    sft_final = str(Path(chosen["from"])) == str(Path(sp.stages.result("3. SFT (LoRA)")["adapter"]))
    sft_s = rep["stages"]["3. SFT (LoRA)"]["seconds"]
    rl_s = rep["stages"].get("4. RL on the edit turn", {}).get("seconds", 0.0)
    shipped = {"point": f"shipped ({chosen['why']})", "train_s": sft_s + (0.0 if sft_final else rl_s),
               "run": "eval-heldout-adapter"}
    if fracs_sft == "off":  # the shipped adapter alone: no earlier checkpoint is evaluated
        return _fill([shipped], out)
    # three budgets at least: SFT at 1/3 and 2/3 when the SFT adapter shipped, else SFT at 1/2,
    # SFT final and the RL adapter
    fracs = fracs_sft if fracs_sft is not None else ((1 / 3, 2 / 3) if sft_final else (1 / 2,))
    picks = sorted({min(ckpts, key=lambda c: abs(c[0] - total * f)) for f in fracs}, key=lambda c: c[0])
    points: list[dict[str, Any]] = []
    for step, path, secs in picks:
        if step == total:
            continue
        merged = merge_adapter_dir(path, sp.base, out / "curve" / f"sft-{step}-merged")
        name = f"eval-heldout-sft-{step}"
        sp.stages.run(f"curve: SFT step {step}", lambda m=merged, n=name: sp.evaluate(
            out / "tasks" / "heldout.jsonl", str(m), n, use="final"), uses=sft_inputs(sp.cfg) + EPISODE_USES, after=("3. SFT (LoRA)",))
        points.append({"point": f"SFT {step}/{total} steps", "train_s": secs, "run": name})
    if not sft_final:  # the SFT adapter itself is a point of its own when RL's adapter shipped
        merged = out / "merged-sft"
        merge_adapter_dir(sp.stages.result("3. SFT (LoRA)")["adapter"], sp.base, merged)
        sp.stages.run("curve: SFT final", lambda: sp.evaluate(out / "tasks" / "heldout.jsonl", str(merged),
                                                              "eval-heldout-sft-final", use="final"),
                      uses=sft_inputs(sp.cfg) + EPISODE_USES, after=("3. SFT (LoRA)",))
        points.append({"point": f"SFT {total}/{total} steps", "train_s": sft_s, "run": "eval-heldout-sft-final"})
    points.append(shipped)
    return _fill(points, out)


def _fill(points: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    """Each point's paired comparison with the base, p values Holm-corrected over the points."""
    for p in points:
        t = paired_table(out / "eval-heldout-base", out / p["run"])
        p.update({k: t[k] for k in ("tasks", "gain_points", "mcnemar_p", "gained", "lost")},
                 rate=t["adapter"]["rate"], ci95=t["adapter"]["ci95"], resolved=t["adapter"]["resolved"])
    for p, q in zip(points, holm([p["mcnemar_p"] for p in points]), strict=True):
        p["mcnemar_p_holm"] = q
    return points


def greedy_arms(run: Path, out: Path) -> dict[str, Path]:
    """The four evaluations of `run`, a copy of this run's training stages evaluated without
    verified edits: refused (SystemExit) unless its adapter is byte-identical to this run's and
    its evaluations had verification off."""
    from etude.paths import dir_sha256

    theirs, ours = dir_sha256(run / "adapter"), dir_sha256(out / "adapter")
    if theirs is None or theirs != ours:
        raise SystemExit(f"--greedy-run {run}: its adapter is missing or differs from {out / 'adapter'}")
    arms = {f"{side}-{arm}": run / f"eval-{side}-{arm}" for side in ("heldout", "general") for arm in ("base", "adapter")}
    for name, d in arms.items():
        mine = out / f"eval-{name}" / "run.json"
        if not (d / "results.jsonl").is_file() or not (d / "run.json").is_file() or not mine.is_file():
            raise SystemExit(f"--greedy-run: {d} is not a finished evaluation")
        them, us = json.loads((d / "run.json").read_text()), json.loads(mine.read_text())
        if int((them.get("config", {}).get("harness") or {}).get("verify_edits", 0) or 0) > 1:
            raise SystemExit(f"--greedy-run: {d} was evaluated with verified edits")
        if (them.get("suite_sha256"), them.get("instance_ids")) != (us.get("suite_sha256"), us.get("instance_ids")):
            raise SystemExit(f"--greedy-run: {d} evaluated other tasks than {mine.parent}")
    return arms


def plot(rep: dict[str, Any], points: list[dict[str, Any]], d: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d.mkdir(parents=True, exist_ok=True)
    base = rep["heldout"]["base"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = [0.0] + [p["train_s"] / 60 for p in points]
    ys = [base["rate"]] + [p["rate"] for p in points]
    lo = [base["ci95"][0]] + [p["ci95"][0] for p in points]
    hi = [base["ci95"][1]] + [p["ci95"][1] for p in points]
    ax.plot(xs, ys, "o-", color="#2a7", label="adapter (held-out functions)")
    ax.fill_between(xs, lo, hi, color="#2a7", alpha=0.15, label="Wilson 95%")
    ax.axhline(base["rate"], color="#999", ls="--", label="base")
    ax.set_xlabel("training minutes (SFT steps, then RL)")
    ax.set_ylabel("resolved")
    ax.set_title(f"{rep['org']}: held-out functions, n = {rep['heldout']['tasks']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    f = d / "budget_curve.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    return [str(f.relative_to(RESULTS.parent.parent))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the general warm-started agent (a model directory)")
    ap.add_argument("--repos", default="click==8.1.7,webcolors==24.8.0")
    ap.add_argument("--org", default="acme")
    ap.add_argument("--minutes", type=float, default=SpecialiseConfig.minutes)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_specialise")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--general-tasks", type=int, default=SpecialiseConfig.general_tasks, help="validation-split tasks of the regression check")
    ap.add_argument("--curve", default=None, help="fractions of the SFT steps to evaluate on the held-out side, "
                    "comma-separated (default 1/3,2/3 or 1/2; 'none' for no extra point; 'off': the shipped adapter "
                         "alone, not even the SFT adapter when RL's shipped)")
    ap.add_argument("--sft-share", default="0.6", help="share of --minutes SFT may use, or 'none' (all its epochs)")
    ap.add_argument("--verify-edits", type=int, default=8,
                    help="evaluations: attempts per edit turn checked against the request's failing tests' files "
                         "(0: one greedy attempt; 8, etude specialise's default, chosen on the select slice)")
    ap.add_argument("--greedy-run", default=None,
                    help="with --verify-edits: a run directory of the same training stages evaluated without "
                         "verification (one greedy attempt); its four evaluations are added as arms greedy-*")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--name", default="specialise",
                    help="the result's name: RESULTS/NAME.json, NAME.records.jsonl and plots in RESULTS/NAME/ "
                         "(another name for a run that is not the bench's organisation, e.g. one repository)")
    a = ap.parse_args()
    t0 = time.time()
    cfg = SpecialiseConfig(org=a.org, repos=tuple(a.repos.split(",")), out=a.out, base=a.base, minutes=a.minutes,
                           seed=a.seed, backend=a.backend, general_tasks=a.general_tasks,
                           sft_share=None if a.sft_share == "none" else float(a.sft_share),
                           verify_edits=a.verify_edits or None)
    fracs: Any = (None if a.curve is None else "off" if a.curve == "off" else ()
                  if a.curve == "none" else tuple(float(x) for x in a.curve.split(",") if x))
    with PeakMemory() as mem:
        rep = run_specialise(cfg)
        sp = Specialise(cfg)  # the same run directory: every stage reads back
        points = curve(sp, rep, fracs)
    res = Path(a.results)
    h, g = rep["heldout"], rep["general"]
    whole = sum(v["seconds"] for v in rep["stages"].values())
    build = sum(rep["stages"].get(k, {}).get("seconds", 0.0) for k in ("1. tasks", "2b. drills"))
    targets = {
        "heldout_gain_points": {"target": TARGETS["heldout_gain_points"], "measured": h["gain_points"],
                                "met": h["gain_points"] >= TARGETS["heldout_gain_points"]},
        "heldout_mcnemar_p": {"target": TARGETS["heldout_mcnemar_p"], "measured": h["mcnemar_p"],
                              "met": h["mcnemar_p"] < TARGETS["heldout_mcnemar_p"]},
        "heldout_tasks": {"target": 60, "measured": h["tasks"], "met": h["tasks"] >= 60},
        "no_regression": {"measured": g["no_regression"], "met": bool(g["no_regression"])},
        "whole_run_minutes": {"target": TARGETS["whole_run_minutes"], "measured": round(whole / 60, 1),
                              "excluding_task_build": round((whole - build) / 60, 1),
                              "met": whole / 60 <= TARGETS["whole_run_minutes"]},
        "adapter_mib": {"target": TARGETS["adapter_mib"], "measured": round(rep["adapter"]["bytes"] / 2**20, 2),
                        "met": rep["adapter"]["bytes"] / 2**20 <= TARGETS["adapter_mib"]},
    }
    out = Path(cfg.out).resolve()
    arms = {"heldout-base": out / "eval-heldout-base", "heldout-adapter": out / "eval-heldout-adapter",
            "general-base": out / "eval-general-base", "general-adapter": out / "eval-general-adapter"}
    figures = {**paired_figures("heldout", "heldout-base", "heldout-adapter"),
               **paired_figures("general", "general-base", "general-adapter")}
    for side in ("heldout", "general"):  # behaviour: episodes that changed the repository at all
        figures[f"{side}.edited"] = {"kind": "paired", "a": {"arm": f"{side}-base"}, "b": {"arm": f"{side}-adapter"},
                                     "key": "task", "field": "edited"}
        figures[f"{side}.tool_use"] = {"kind": "paired", "a": {"arm": f"{side}-base"},
                                       "b": {"arm": f"{side}-adapter"}, "key": "task", "field": "tool_use"}
    for p in points:
        if p["run"] != "eval-heldout-adapter":
            arm_name = "heldout-" + p["run"].removeprefix("eval-heldout-")
            arms[arm_name] = out / p["run"]
            figures[f"curve.{arm_name}_vs_heldout-base"] = {"kind": "paired", "a": {"arm": "heldout-base"},
                                                           "b": {"arm": arm_name}, "key": "task", "field": "resolved",
                                                           "family": "budget_curve"}
    figures["heldout.heldout-adapter_vs_heldout-base"]["family"] = "budget_curve"
    greedy = greedy_arms(Path(a.greedy_run), out) if a.greedy_run else {}
    for side in ("heldout", "general") if greedy else ():
        arms[f"greedy-{side}-base"] = greedy[f"{side}-base"]
        arms[f"greedy-{side}-adapter"] = greedy[f"{side}-adapter"]
        figures.update(paired_figures(f"greedy.{side}", f"greedy-{side}-base", f"greedy-{side}-adapter"))
    meta = {
        "what": "etude specialise: a LoRA adapter on the general warm start, trained on the org's train functions, "
                "measured on held-out functions (paired with the base) and on the general validation split",
        "org": rep["org"], "repos": rep["repos"], "base": rep["base"], "split": rep["split"], "adapter": rep["adapter"],
        "heldout": {k: v for k, v in h.items() if k != "per_task"},
        "general": {k: v for k, v in g.items() if k != "per_task"},
        "budget_curve": {"points": points, "correction": "Holm over the curve's points (figures family budget_curve)",
                         "note": "reported, not picked from: the shipped adapter was chosen on the select slice"},
        "harness": {"verify_edits": a.verify_edits,
                    "read_max_lines": eval_harness(cfg.agent_config).tools_config.read_max_lines,
                    "greedy_run": {"dir": str(Path(a.greedy_run).resolve()), "note": "the same adapter "
                                   "(byte-identical) on the same tasks, evaluated with one greedy attempt"}
                    if greedy else None},
        "stages": rep["stages"], "memory": mem.to_dict(), "targets": targets,
        "plots": plot(rep, points, res / a.name),
    }
    prov = provenance(seeds={"split": a.seed, "curriculum": a.seed, "drills": a.seed + 7}, started=t0,
                      stages={**rep["stages"], **sp.stages.times()})
    write_result(res / f"{a.name}.json", figures, eval_records(arms), prov, meta=meta)
    print(json.dumps({"heldout": meta["heldout"], "no_regression": g["no_regression"],
                      "curve": [(p["point"], p["resolved"], p["mcnemar_p_holm"]) for p in points]}, default=str))


if __name__ == "__main__":
    main()
