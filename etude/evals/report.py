"""report.html for an `etude eval` output folder: a summary table, plots, and one section per task.

The page is static (no script, no network): a jinja2 template (templates/report.html.j2) and two
matplotlib PNGs under plots/ (correctness against tokens; metric bars with their intervals). Each
task section shows the request, the agent's diff beside the gold diff, the test results, the
reward breakdown, the hack flags and the adherence evidence. It is regenerated from the files in
the folder, so `etude eval report DIR` rebuilds it after a resumed run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.adherence import COMPONENTS
from etude.evals.records import read_records
from etude.evals.summary import by_task
from etude.tasks import load_tasks


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, text) per line of a unified diff."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("diff --git", "+++", "---", "new file", "deleted file", "index ")):
            cls = "hdr"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


def _plots(out: Path, summary: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none wanted
    import matplotlib.pyplot as plt

    d = out / "plots"
    d.mkdir(exist_ok=True)
    ok = [r for r in records if r.get("status") == "ok"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for flag, colour, label in ((True, "tab:green", "resolved"), (False, "tab:red", "not resolved")):
        pts = [r["efficiency"]["tokens"] for r in ok if bool(r.get("resolved")) is flag]
        ax.scatter(pts, [1.0 if flag else 0.0] * len(pts), c=colour, alpha=0.6, label=label)
    rate = summary["correctness"]["resolved_rate"]
    tok = summary["efficiency"]["tokens"]
    if rate["mean"] is not None and tok["mean"] is not None:
        err = [[max(0.0, rate["mean"] - rate["ci_low"])], [max(0.0, rate["ci_high"] - rate["mean"])]]
        ax.errorbar(
            [tok["mean"]],
            [rate["mean"]],
            yerr=err,
            fmt="D",
            c="black",
            capsize=4,
            label="run: mean tokens, resolved rate",
        )
    ax.set(
        xlabel="tokens per episode (prompt + completion)",
        ylabel="resolved",
        ylim=(-0.1, 1.1),
        title="Correctness vs tokens",
    )
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(d / "correctness_vs_tokens.png", dpi=90)
    plt.close(fig)
    _bars(d / "metrics.png", summary, plt)
    return {"tokens": "plots/correctness_vs_tokens.png", "metrics": "plots/metrics.png"}


def _bars(path: Path, summary: dict[str, Any], plt: Any) -> None:
    items = [("resolved", summary["correctness"]["resolved_rate"]), ("partial", summary["correctness"]["partial_rate"]),
             ("adherence", summary["adherence"]["score"]),
             *((c, summary["adherence"]["components"][c]) for c in COMPONENTS)]  # fmt: skip
    names = [n for n, _ in items]
    means = [m["mean"] if m["mean"] is not None else 0.0 for _, m in items]
    lo = [max(0.0, m["mean"] - m["ci_low"]) if m["mean"] is not None else 0.0 for _, m in items]
    hi = [max(0.0, m["ci_high"] - m["mean"]) if m["mean"] is not None else 0.0 for _, m in items]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.bar(
        names,
        means,
        yerr=[lo, hi],
        capsize=3,
        color=["tab:green", "tab:olive", "tab:blue", *["tab:cyan"] * len(COMPONENTS)],
    )
    ax.set(ylim=(0, 1.05), ylabel="mean over tasks", title="Correctness and adherence (with intervals)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _fmt(m: dict[str, Any] | None, pct: bool = False) -> str:
    if not m or m.get("mean") is None:
        return "n/a"
    f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.3g}")
    return f"{f(m['mean'])} [{f(m['ci_low'])}, {f(m['ci_high'])}]"


def summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, value with interval) rows of the summary table."""
    c, e = s["correctness"], s["efficiency"]
    rows = [("resolved rate", _fmt(c["resolved_rate"], True)), ("partial rate", _fmt(c["partial_rate"], True))]
    rows += [(f"pass@{k}", _fmt(v, True)) for k, v in c["pass_at_k"].items()]
    rows += [("adherence score", _fmt(s["adherence"]["score"]))]
    rows += [(f"adherence: {k}", _fmt(v)) for k, v in s["adherence"]["components"].items()]
    rows += [("reward (total)", _fmt(s["reward"]))]
    rows += [(f"{k} per episode", _fmt(v)) for k, v in e.items() if k != "stop_reasons"]
    rows += [("stop reasons", json.dumps(e.get("stop_reasons", {}))), ("hack flags", json.dumps(s["flags"]) or "{}"),
             ("episodes / errors / missing", f"{s['episodes']} / {s['errors']} / {len(s['missing'])}")]  # fmt: skip
    return rows


def _task_view(task: Any, recs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": task.instance_id, "request": task.problem_statement, "gold": _diff_lines(task.patch),
            "episodes": [_episode_view(r) for r in recs]}  # fmt: skip


def _episode_view(r: dict[str, Any]) -> dict[str, Any]:
    o = r.get("outcome") or {}
    tests = [(k, v, "F2P") for k, v in (o.get("fail_to_pass") or {}).items()]
    tests += [(k, v, "P2P") for k, v in (o.get("pass_to_pass") or {}).items()]
    passed = sum(1 for _, v, _ in tests if v == "passed")
    reward = r.get("reward") or {}
    terms = [(k, v, (reward.get("weights") or {}).get(k)) for k, v in (reward.get("terms") or {}).items()]
    return {
        "sample": r.get("sample", 0), "status": r.get("status"), "error": r.get("error") or o.get("error"),
        "resolved": r.get("resolved"), "partial": r.get("partial"), "diff": _diff_lines(r.get("diff") or ""),
        "tests_passed": passed, "tests_total": len(tests), "failing": [t for t in tests if t[1] != "passed"][:30],
        "total": reward.get("total"), "terms": terms, "flags": r.get("flags") or [],
        "adherence": r.get("adherence") or {}, "efficiency": r.get("efficiency") or {},
        "trajectory": r.get("trajectory"),
    }  # fmt: skip


def write_report(out_dir: str | Path) -> Path:
    """Render OUT/report.html from run.json, tasks.jsonl, results.jsonl and summary.json."""
    import jinja2

    out = Path(out_dir)
    if not (out / "summary.json").is_file():
        raise EtudeError(f"{out} has no summary.json (run etude eval first)")
    summary = json.loads((out / "summary.json").read_text())
    tasks = load_tasks(out / "tasks.jsonl")
    records = list(read_records(out / "results.jsonl").values())
    groups = by_task(records, tasks)
    env = jinja2.Environment(loader=jinja2.PackageLoader("etude.evals", "templates"), autoescape=True)
    html = env.get_template("report.html.j2").render(
        summary=summary, rows=summary_rows(summary), plots=_plots(out, summary, records),
        tasks=[_task_view(t, groups[t.instance_id]) for t in tasks],
    )  # fmt: skip
    path = out / "report.html"
    path.write_text(html, encoding="utf-8")
    return path
