"""Does an adapter trained on a repository's code at a cut-off predict the code written after it?

Runs `etude specialise --until` (etude.pipeline.specialise_time, the same stages as the command)
once per repository, each as its own organisation: a LoRA adapter trained on that repository's
text at the cut-off for the default budget (the checkpoint shipped is the one with the lowest loss
on held-out blocks of that text), measured against the base on lines its maintainers
added after the cut-off (loss, token accuracy, whole-line, rest-of-line and next-identifier exact
match, line-level adherence to the repository's own names), at three points of the budget (the
curve), and on the other repositories' post-cut-off lines (no regression). Families are Holm-
corrected across the repositories.

    ETUDE_HISTORY_SOURCES=DIR python bench/specialise_time.py --out runs/bench_specialise_time

Writes bench/results/specialise_time.json (figures recomputed by bench/verify.py from
specialise_time.records.jsonl) and bench/results/specialise_time/curve.png, through
etude.evals.results.write_result.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from etude.evals.results import write_result
from etude.pipeline.specialise_time import TimeSpecialiseConfig, figure_specs, run_time_specialise, targets
from etude.provenance import provenance

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "repos": "dict",
    "settings": "dict",
    "train": "dict",
    "stages": "dict",
    "targets": "dict",
    "budget_curve": "dict",
    "plots": "list",
}

RESULTS = Path(__file__).resolve().parent / "results"
REPOS = {"mistune": "2025-01-01", "more-itertools": "2025-06-01", "validators": "2024-01-01"}


def plot_curve(curve: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for repo, pts in curve.items():
        xs = [0] + [p["steps"] for p in pts]
        ys = [0] + [p["loss_diff"] for p in pts]
        lo = [0] + [p["ci_low"] for p in pts]
        hi = [0] + [p["ci_high"] for p in pts]
        ax.plot(xs, ys, marker="o", label=repo)
        ax.fill_between(xs, lo, hi, alpha=0.15)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("training steps (4 x 512 tokens of the cut-off's text)")
    ax.set_ylabel("loss change on post-cut-off lines\n(nats/token, adapter - base)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_specialise_time")
    ap.add_argument("--repos", default=",".join(f"{k}={v}" for k, v in REPOS.items()),
                    help="NAME=CUTOFF,... (builtin:history names or local repositories)")
    ap.add_argument("--minutes", type=float, default=TimeSpecialiseConfig.minutes)
    ap.add_argument("--items", type=int, default=TimeSpecialiseConfig.items)
    ap.add_argument("--results", default=str(RESULTS / "specialise_time.json"))
    args = ap.parse_args()
    started = time.time()
    pairs = [x.split("=", 1) for x in args.repos.split(",")]
    records: list[dict[str, Any]] = []
    specs: dict[str, dict[str, Any]] = {}
    runs: dict[str, Any] = {}
    for name, until in pairs:
        others = [(n, u) for n, u in pairs if n != name]
        cfg = TimeSpecialiseConfig(org=name, repos=(name,), until=(until,), out=str(Path(args.out) / name),
                                   minutes=args.minutes, items=args.items, regress=tuple(n for n, _ in others),
                                   regress_until=tuple(u for _, u in others))
        rep = run_time_specialise(cfg)
        records += [json.loads(x) for x in (Path(cfg.out) / "records.jsonl").read_text().splitlines()]
        specs |= figure_specs(name, [name], [n for n, _ in others], cfg.checkpoints,
                              loss_margin=cfg.loss_margin, acc_margin=cfg.acc_margin, chosen=rep["train"]["chosen"])
        runs[name] = rep
    doc = write_result(Path(args.results), specs, records, provenance(started=started, seeds={"split": 0, "train": 0},
                       stages={n: r["stages"] for n, r in runs.items()}),
                       meta={"what": "LoRA on each repository's text at a cut-off vs the base, on lines added after it",
                             "repos": {n: {k: v for k, v in r["split"].items()} for n, r in runs.items()},
                             "settings": {k: v for k, v in vars(args).items() if k != "results"}
                             | {"ctx_tokens": TimeSpecialiseConfig.ctx_tokens, "lr": TimeSpecialiseConfig.lr,
                                "lora_r": TimeSpecialiseConfig.lora_r, "block": TimeSpecialiseConfig.block,
                                "batch": TimeSpecialiseConfig.batch, "loss_margin": TimeSpecialiseConfig.loss_margin,
                                "acc_margin": TimeSpecialiseConfig.acc_margin},
                             "train": {n: {k: r["train"].get(k) for k in ("steps", "planned_steps", "seconds", "blocks",
                                                                            "val_blocks", "tokens", "chosen", "checkpoints")}
                                       for n, r in runs.items()},
                             "stages": {n: {"wall_s": r["wall_s"], **r["stages"]} for n, r in runs.items()}})
    figs = doc["figures"]
    tg = {n: targets(figs, n, [n], [o for o, _ in pairs if o != n]) for n, _ in pairs}
    curve = {}
    for n, r in runs.items():
        curve[n] = []
        for c in r["train"]["checkpoints"]:
            f = figs[f"{n}.loss" if c["fraction"] == r["train"]["chosen"] else f"{n}@{c['fraction']:g}.loss"]
            curve[n].append({"fraction": c["fraction"], "steps": c["steps"], "loss_diff": f["mean_diff"],
                             "ci_low": f["ci_low"], "ci_high": f["ci_high"], "val_loss": c.get("val_loss"),
                             "shipped": c["fraction"] == r["train"]["chosen"]})
    png = RESULTS / "specialise_time" / "curve.png"
    plot_curve(curve, png)
    doc = write_result(Path(args.results), specs, records, doc["provenance"],
                       meta=doc["meta"] | {"targets": tg, "budget_curve": curve,
                                           "plots": [str(png.relative_to(RESULTS.parent.parent))]})
    for n in runs:
        lo = figs[f"{n}.loss"]
        print(f"{n}: loss {lo['mean_a']:.3f} -> {lo['mean_b']:.3f} ({lo['ci_low']:+.3f}..{lo['ci_high']:+.3f}); "
              f"targets {tg[n]}")


if __name__ == "__main__":
    main()
