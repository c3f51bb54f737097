"""`etude specialise`'s HTML report: held-out and general rates with intervals (a plot and a
table), the split, stage times, and one held-out task's trajectory from the base and the adapter
side by side. A static page beside PNGs in plots/; every figure comes from report.json."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>etude specialise: {{ r.org }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px;max-height:28em}
img{max-width:100%;border:1px solid #eee}.note{color:#555;font-size:.92em}
</style></head><body>
<h1>Specialised to <code>{{ r.org }}</code></h1>
<p class="note">Repositories: {{ r.repos|join(", ") }}. Base: <code>{{ r.base }}</code>. The adapter trained on the
train functions only; held-out tasks are bugs in functions no training task touched. Resolved rates with Wilson
95% intervals; p is exact McNemar on the paired tasks.</p>
{% if plot %}<img src="{{ plot }}" alt="held-out and general resolved rates">{% endif %}
<h2>Held-out functions of the organisation's repositories</h2>{{ held }}
<h2>General validation split (regression check)</h2>{{ gen }}
<p>no_regression: <b>{{ r.general.no_regression }}</b> (adapter at most 3 points below the base and no significant
harm, one-sided exact p = {{ "%.3g"|format(r.general.harm_p) }})</p>
<h2>Split (by function)</h2>{{ split }}
<h2>Stages</h2>{{ stages }}
<h2>One held-out task, base and adapter</h2>
{% if side %}<p>task <code>{{ side.task }}</code> — resolved: {{ side.resolved }}</p>
<div style="display:flex;gap:1em">{% for name, body in side.columns %}<div style="flex:1;min-width:0"><h3>{{ name }}</h3><pre>{{ body }}</pre></div>{% endfor %}</div>
{% else %}<p>none</p>{% endif %}
</body></html>
"""


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any, i: int) -> str:
        cls = ' class="l"' if i == 0 or isinstance(v, str) else ""
        if isinstance(v, float):
            v = f"{v:.4g}"
        return f"<td{cls}>{html.escape(str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v, i) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def comparison_table(c: dict[str, Any], names: tuple[str, str] = ("base", "adapter")) -> str:
    rows = []
    for n in names:
        a = c[n]
        vc = a.get("valid_call_rate")
        tok = a.get("tokens_per_episode")
        rows.append([n, f"{a['resolved']}/{c['tasks']}", f"{a['rate']:.1%}", f"{a['ci95'][0]:.1%}–{a['ci95'][1]:.1%}",
                     f"{vc:.1%}" if vc is not None else "–", f"{tok:,.0f}" if tok is not None else "–"])
    t = table(["model", "resolved", "rate", "Wilson 95%", "valid calls", "tokens / episode"], rows)
    return t + (f"<p>gained {c['gained']}, lost {c['lost']}, change {c['gain_points']:+.1%}, "
                f"exact McNemar p = {c['mcnemar_p']:.3g}</p>")


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display here, and none wanted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out, write (PNG, 110 dpi, its folder made) and close `fig`; returns `path`."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def rates_plot(r: dict[str, Any], path: Path) -> Path | None:
    fig, ax = pyplot().subplots(figsize=(7, 3.4))
    groups = [("held-out functions", r["heldout"]), ("general validation", r["general"])]
    for gi, (_label, c) in enumerate(groups):
        for ai, name in enumerate(("base", "adapter")):
            a = c[name]
            x = gi * 3 + ai
            ax.bar(x, a["rate"], color=("#999" if name == "base" else "#2a7"), label=name if gi == 0 else None)
            ax.errorbar(x, a["rate"], yerr=[[a["rate"] - a["ci95"][0]], [a["ci95"][1] - a["rate"]]], color="k",
                        capsize=4)
    ax.set_xticks([0.5, 3.5], [f"{g[0]} (n={g[1]['tasks']})" for g in groups])
    ax.set_ylabel("resolved (Wilson 95%)")
    ax.legend()
    return save_figure(fig, path)


def transcript(run: Path, task_id: str, limit: int = 900) -> str:
    """The messages (after the system prompt) of `task_id`'s episode in evaluation `run`."""
    for ln in (run / "results.jsonl").read_text().splitlines():
        r = json.loads(ln)
        if r["instance_id"] == task_id and r.get("trajectory"):
            lines = (run / r["trajectory"]).read_text().splitlines()
            if not lines:
                return "(empty trajectory)"
            t = json.loads(lines[-1])
            return "\n".join(f"[{m['role']}] {m.get('content', '')[:limit]}" for m in t.get("messages", [])[1:12])
    return "(not found)"


def side_by_side(base_run: Path, new_run: Path, per_task: dict[str, dict[str, int]],
                 names: tuple[str, str] = ("base", "adapter")) -> dict[str, Any] | None:
    """One task both evaluated: one the new model resolved and the base did not, if any."""
    if not per_task:
        return None
    tid = sorted(per_task, key=lambda i: (-(per_task[i][names[1]] - per_task[i][names[0]]), -per_task[i][names[1]], i))[0]
    return {"task": tid, "resolved": per_task[tid],
            "columns": [(names[0], transcript(base_run, tid)), (names[1], transcript(new_run, tid))]}


def write_specialise_report(out: Path, r: dict[str, Any]) -> Path:
    plot = rates_plot(r, out / "plots" / "rates.png")
    sp = r["split"]
    split = table(["side", "functions", "tasks"], [[k, sp[k]["functions"], sp[k]["tasks"]]
                                                   for k in ("train", "select", "heldout")])
    split += f"<p>{sp['dropped']} tasks touched both sides and were dropped; {sp['drills']} fix drills (train functions).</p>"
    stages = table(["stage", "seconds", "resumed"], [[k, v["seconds"], str(v["resumed"])] for k, v in r["stages"].items()])
    side = side_by_side(out / "eval-heldout-base", out / "eval-heldout-adapter", r["heldout"]["per_task"])
    from markupsafe import Markup

    page = jinja2.Environment(autoescape=True).from_string(TEMPLATE).render(
        r=r, plot=plot.relative_to(out).as_posix() if plot else None, side=side,
        held=Markup(comparison_table(r["heldout"])), gen=Markup(comparison_table(r["general"])),
        split=Markup(split), stages=Markup(stages))
    path = out / "report.html"
    path.write_text(page)
    return path
