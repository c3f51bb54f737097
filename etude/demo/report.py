"""The demo's HTML report: learning curve, eval comparison, A/B table, cycle timings, trajectories.

A static page (no script, no network) beside PNG plots in `plots/`. Every figure on it is read
from files the demo run wrote; nothing is typed in by hand.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import jinja2

from etude.pipeline.report import comparison_table, pyplot, rates_plot, save_figure, table

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>etude demo report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.bad{color:#b00}.good{color:#070}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px;max-height:28em}
img{max-width:100%;border:1px solid #eee}.note{color:#555;font-size:.92em}
</style></head><body>
<h1>etude demo</h1>
<p class="note">{{ intro }}</p>
<table id="summary"><tr><th class="l">stage</th><th class="l">result</th><th>seconds</th></tr>
{% for s in stages %}<tr><td class="l">{{ s.name }}</td><td class="l">{{ s.result }}</td><td>{{ "%.1f"|format(s.seconds) }}</td></tr>{% endfor %}
</table>

<h2>1. Does the agent learn? Held-out packages, base → general warm start</h2>
{{ heldout_table }}
{% if plots.heldout %}<img src="{{ plots.heldout }}" alt="held-out resolved rates">{% endif %}
<p class="note">{{ learning_note }}</p>
{% if plots.sft %}<img src="{{ plots.sft }}" alt="SFT loss">{% endif %}
{% if plots.learning %}<img src="{{ plots.learning }}" alt="RL curve">{% endif %}

<h2>2. Specialised to one organisation's code: trained up to a cut-off, measured on what it wrote after</h2>
{% if time_table %}<p class="note">{{ time_note }}</p>{{ time_table }}
{% if plots.time %}<img src="{{ plots.time }}" alt="loss change on post-cut-off lines against the training budget">{% endif %}
{% else %}<p>not run</p>{% endif %}

<h2>2b. Specialised to one organisation: its held-out functions, before and after (<code>--full</code>)</h2>
{% if spec %}<p class="note">{{ spec_note }}</p>
{% if plots.spec %}<img src="{{ plots.spec }}" alt="specialised: held-out and general rates">{% endif %}
<h3>held-out functions of {{ spec_org }}'s repositories</h3>{{ spec_held }}
<h3>general validation split (regression check)</h3>{{ spec_gen }}
{% if spec_side %}<h3>one held-out task, before and after</h3><p>task <code>{{ spec_side.task }}</code> — resolved: {{ spec_side.resolved }}</p>
<div style="display:flex;gap:1em">{% for name, body in spec_side.columns %}<div style="flex:1;min-width:0"><h4>{{ name }}</h4><pre>{{ body }}</pre></div>{% endfor %}</div>{% endif %}
{% else %}<p>not run</p>{% endif %}

<h2>3. Eval gate: trained checkpoint vs base</h2>
{{ eval_table }}
<p class="note">{{ eval_note }}</p>

<h2>4. Real-time cycle</h2>
{% if plots.cycle %}<img src="{{ plots.cycle }}" alt="cycle timings">{% endif %}
{{ cycle_table }}
<h3>A/B readout (canary)</h3>
{{ ab_table }}
<p><b>Decision:</b> {{ decision }}</p>
<h3>What decided it</h3>
{{ decision_table }}

<h2>5. The same held-out task, base and warm start</h2>
{% if side %}<p>task <code>{{ side.task }}</code> — resolved: {{ side.resolved }}</p>
<div style="display:flex;gap:1em">{% for name, body in side.columns %}<div style="flex:1;min-width:0"><h3>{{ name }}</h3><pre>{{ body }}</pre></div>{% endfor %}</div>
{% else %}<p>not run</p>{% endif %}
{% for t in trajectories %}<h3>{{ t.title }}</h3><pre>{{ t.body }}</pre>{% endfor %}
</body></html>
"""


TIME_MEASURES = (("loss", "loss (nats/token, lower is better)"), ("token_acc", "token accuracy"),
                 ("line_em", "whole line exact"), ("rest_em", "rest of line given its first half"),
                 ("ident_em", "next identifier"), ("adherence", "the repository's own names (adherence)"))


def time_rows(st: dict[str, Any]) -> list[list[Any]]:
    """The specialisation by time's comparisons (report.json figures), one row per measure."""
    f = st["figures"]
    rows = []
    for name, r in st["split"].items():
        if r["role"] != "own":
            continue
        for key, label in TIME_MEASURES:
            x = f.get(f"{name}.{key}")
            if x is None:
                continue
            if x["kind"] == "paired_mean":
                rows.append([f"{name}: {label}", _f(x["mean_a"]), _f(x["mean_b"]),
                             f"{x['mean_diff']:+.4f} [{_f(x['ci_low'])}, {_f(x['ci_high'])}]", x["n"],
                             _f(x.get("p_holm", x["p"]))])
            else:
                rows.append([f"{name}: {label}", f"{x['a_k']}/{x['n']}", f"{x['b_k']}/{x['n']}",
                             f"{x['gain']:+.1%} ({x['b_only']} gained, {x['a_only']} lost)", x["n"],
                             _f(x.get("p_holm", x["p"]))])
    for k, x in f.items():
        if ".regress." in k:
            rows.append([f"no regression: {k.split('.regress.', 1)[1]}", _f(-x["mean_a"] if "loss" in k else x["mean_a"]),
                         _f(-x["mean_b"] if "loss" in k else x["mean_b"]),
                         f"non-inferior: {x['noninferior']} (margin {x['margin']:g})", x["n"], _f(x["p"])])
    return rows


def time_plot(st: dict[str, Any], path: Path) -> Path | None:
    f = st["figures"]
    fig, ax = pyplot().subplots(figsize=(6, 3.4))
    drawn = False
    for name, r in st["split"].items():
        if r["role"] != "own":
            continue
        pts = [(0, 0.0, 0.0, 0.0)]
        for c in st["train"]["checkpoints"]:
            x = f.get(f"{name}.loss" if c["fraction"] == st["train"].get("chosen", 1.0)
                      else f"{name}@{c['fraction']:g}.loss")
            if x and x["ci_low"] is not None:
                pts.append((c["steps"], x["mean_diff"], x["ci_low"], x["ci_high"]))
        if len(pts) > 1:
            xs, ys, lo, hi = zip(*pts, strict=True)
            ax.plot(xs, ys, "o-", label=name)
            ax.fill_between(xs, lo, hi, alpha=0.2)
            drawn = True
    if not drawn:
        return None
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("training steps on the cut-off's text")
    ax.set_ylabel("loss change after the cut-off\n(nats/token, adapter - base)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def learning_plot(metrics: list[dict[str, Any]], evals: list[dict[str, Any]], path: Path) -> Path | None:
    steps = [m["step"] for m in metrics if "reward" in m]
    if not steps:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 3.6))
    ax.plot(steps, [m["reward"] for m in metrics if "reward" in m], "o-", label="train reward (group mean)")
    pts = [(e.get("step", 0), e.get("success")) for e in evals if e.get("success") is not None]
    if pts:
        xs, ys = zip(*pts, strict=True)
        lo = [e.get("ci_low", y) for e, y in zip([e for e in evals if e.get("success") is not None], ys, strict=True)]
        hi = [e.get("ci_high", y) for e, y in zip([e for e in evals if e.get("success") is not None], ys, strict=True)]
        ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo, strict=True)], [b - y for y, b in zip(ys, hi, strict=True)]],
                    fmt="s--", capsize=3, label="held-out success (95% CI)")
    ax.set_xlabel("step")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def cycle_plot(stages: dict[str, float], path: Path) -> Path | None:
    if not stages:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 0.4 * len(stages) + 1))
    names = list(stages)
    ax.barh(names, [stages[n] for n in names], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("real-time cycle: time per stage")
    return save_figure(fig, path)


def heldouttable(held: dict[str, Any] | None) -> str:
    if not held:
        return "<p>not run</p>"
    def use(n: str) -> list[Any]:  # episodes with a well-formed tool call (absent in older demo.json files)
        u = held[n].get("tool_use")
        return [u["episodes"], f"[{_f(u['ci95'][0])}, {_f(u['ci95'][1])}]"] if u else ["–", "–"]

    rows = [[n, held[n]["resolved"], held[n]["tasks"], held[n]["rate"],
             f"[{_f(held[n]['ci95'][0])}, {_f(held[n]['ci95'][1])}]", *use(n)]
            for n in ("base", "sft", "rl") if n in held]
    pairs = [[k.replace("_vs_", " vs "), v["gain"], v["mcnemar_p"], v.get("tool_use_gain", "–"),
              v.get("tool_use_mcnemar_p", "–")] for k, v in held.items() if "_vs_" in k]
    return (table(["stage", "resolved", "tasks", "rate", "Wilson 95% CI", "episodes with a well-formed tool call",
                    "its Wilson 95% CI"], rows)
            + table(["comparison", "resolved gain (points)", "exact McNemar p", "tool-use gain (points)",
                      "its exact McNemar p"], pairs))


def heldout_plot(held: dict[str, Any] | None, path: Path) -> Path | None:
    names = [n for n in ("base", "sft", "rl") if held and n in held]
    if not names:
        return None
    panels = [("held-out resolved (%)", [held[n] for n in names])]
    if all("tool_use" in held[n] for n in names):
        panels.append(("episodes with a well-formed\ntool call (%)", [held[n]["tool_use"] for n in names]))
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 3.2), squeeze=False)
    for ax, (label, figs) in zip(axes[0], panels, strict=True):
        rates = [f["rate"] * 100 for f in figs]
        err = [[r - f["ci95"][0] * 100 for f, r in zip(figs, rates, strict=True)],
               [f["ci95"][1] * 100 - r for f, r in zip(figs, rates, strict=True)]]
        ax.bar(names, rates, yerr=err, capsize=6, color=["#999", "#4a7", "#37b"][: len(names)])
        ax.set_ylabel(label)
        ax.set_ylim(0, 105)
    return save_figure(fig, path)


def sft_plot(metrics: list[dict[str, Any]], path: Path) -> Path | None:
    if not metrics:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 3.0))
    ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], "o-")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss on assistant tokens")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def evaltable(comparison: dict[str, Any] | None) -> str:
    if not comparison:
        return "<p>not run</p>"
    rows = []
    for name, m in comparison.get("metrics", {}).items():
        if m.get("n", 0) == 0:
            continue
        rows.append([name, m.get("a"), m.get("b"), m.get("delta"),
                     f"[{_f(m.get('ci_low'))}, {_f(m.get('ci_high'))}]", m.get("p_value") if m.get("p_value") is not None else "",
                     "REGRESSION" if m.get("regression") else ("improved" if m.get("improvement") else "")])
    return table(["metric", "base", "trained", "delta", "95% CI", "p (paired)", ""], rows)


def abtable(readout: dict[str, Any] | None) -> str:
    if not readout:
        return "<p>no readout</p>"
    rows = []
    for name, m in readout.get("metrics", {}).items():
        rows.append([name, m.get("control"), m.get("treatment"), m.get("delta"),
                     f"[{_f(m.get('ci_low'))}, {_f(m.get('ci_high'))}]", m.get("p_value"), m.get("msprt_p")])
    srm = f"<p>users per arm: {html.escape(json.dumps(readout.get('users', {})))}; SRM p = {_f(readout.get('srm_p'))}</p>"
    return table(["metric", "control", "treatment", "lift", "95% CI", "p", "mSPRT p (always valid)"], rows) + srm


def decision_rows(rep: dict[str, Any] | None) -> list[list[Any]]:
    """The org cycle's decision and the numbers it was taken on, from `CycleReport.to_dict()`:
    its basis (readout, gate, or gate-only), the gate's resolved rates with the interval, the
    canary's plan against the users it reached, the primary metric's lift, the alarms."""
    if not rep or not rep.get("decision"):
        return []
    rows: list[list[Any]] = [["decision", f"{rep['decision']} (basis: {rep.get('basis') or '–'})"],
                             ["reason", rep.get("reason") or "–"]]
    gate = rep.get("eval") or {}
    if gate:
        r = (gate.get("metrics") or {}).get("resolved") or {}
        rows.append(["eval gate", f"{gate.get('gate')} on {gate.get('tasks')} held-out task(s): resolved "
                                  f"{_pct(gate.get('production_resolved'))} (production) → "
                                  f"{_pct(gate.get('candidate_resolved'))} (candidate), Δ {_pct(r.get('delta'), True)} "
                                  f"[{_pct(r.get('ci_low'), True)}, {_pct(r.get('ci_high'), True)}]"])
    plan = rep.get("plan") or {}
    if plan:
        need, reach = plan.get("users_per_arm"), plan.get("reach")
        rows.append(["canary plan", f"{plan.get('mode')}: mde {_pct(plan.get('mde'))} from {plan.get('source')}; "
                                    f"users per arm planned {'/'.join(map(str, need)) if need else '–'}, window reaches "
                                    f"{'/'.join(f'{x:.0f}' for x in reach) if reach else '–'}"
                                    + (f" — {plan['line']}" if plan.get("line") else "")])
    ab = rep.get("ab") or {}
    if ab:
        users = ab.get("users") or {}
        rows.append(["users per arm", f"control {users.get('control', '–')}, canary {users.get('treatment', '–')} "
                                      f"after {(rep.get('canary') or {}).get('rounds', '–')} round(s); SRM p {_f(ab.get('srm_p'))}"])
        m = (ab.get("metrics") or {}).get(rep.get("primary") or "")
        if m and m.get("delta") is not None:
            rows.append([f"{rep['primary']} (primary)",
                         f"lift {_pct(m['delta'], True)} [{_pct(m.get('ci_low'), True)}, {_pct(m.get('ci_high'), True)}], "
                         f"always-valid [{_pct(m.get('msprt_ci_low'), True)}, {_pct(m.get('msprt_ci_high'), True)}], "
                         f"mSPRT p {_f(m.get('msprt_p'))}"])
    fired = [a["metric"] for a in rep.get("alarms") or [] if a.get("fired")]
    if rep.get("alarms") is not None:
        rows.append(["hack alarms", ", ".join(fired) if fired else "none fired"])
    return rows


def _pct(x: Any, signed: bool = False) -> str:
    if not isinstance(x, (int, float)):
        return "–"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _f(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else "–"


def write_report(out: Path, data: dict[str, Any]) -> Path:
    """`data` keys: intro, stages [(name, result, seconds)], metrics, evals, comparison, cycle
    (stage -> seconds), cycle_rows, readout, decision, cycle_report (CycleReport.to_dict()), trajectories [(title, body)], learning_note, eval_note."""
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lp = learning_plot(data.get("metrics", []), data.get("evals", []), plots / "learning.png")
    cp = cycle_plot(data.get("cycle", {}), plots / "cycle.png")
    hp = heldout_plot(data.get("heldout"), plots / "heldout.png")
    sp = sft_plot(data.get("sft_metrics", []), plots / "sft.png")
    spec = data.get("specialise")
    spec_plot = None
    if spec:

        spec_plot = rates_plot(spec, plots / "specialise.png")
    st = data.get("specialise_time")
    tp = time_plot(st, plots / "specialise_time.png") if st else None
    page = jinja2.Environment(autoescape=True).from_string(TEMPLATE).render(
        time_table=_markup(table(["measure", "base", "adapter", "difference [95% CI]", "lines", "p (Holm)"],
                                 time_rows(st))) if st else "",
        time_note=data.get("specialise_time_note", ""),
        spec=spec, spec_org=(spec or {}).get("org"), spec_note=data.get("specialise_note", ""),
        spec_held=_markup(comparison_table(spec["heldout"], ("base", "adapter"))) if spec else "",
        spec_gen=_markup(comparison_table(spec["general"], ("base", "adapter"))) if spec else "",
        spec_side=data.get("specialise_side"),
        intro=data.get("intro", ""),
        stages=[{"name": n, "result": r, "seconds": s} for n, r, s in data.get("stages", [])],
        plots={"learning": lp and "plots/learning.png", "cycle": cp and "plots/cycle.png",
               "heldout": hp and "plots/heldout.png", "sft": sp and "plots/sft.png",
               "spec": spec_plot and "plots/specialise.png", "time": tp and "plots/specialise_time.png"},
        heldout_table=_markup(heldouttable(data.get("heldout"))),
        side=data.get("side_by_side"),
        learning_note=data.get("learning_note", ""),
        eval_table=_markup(evaltable(data.get("comparison"))),
        eval_note=data.get("eval_note", ""),
        cycle_table=_markup(table(["stage", "status", "seconds"], data.get("cycle_rows", []))),
        ab_table=_markup(abtable(data.get("readout"))),
        decision=data.get("decision", "–"),
        decision_table=_markup(table(["what", "figure"], decision_rows(data.get("cycle_report")))
                               if data.get("cycle_report") else "<p>no cycle</p>"),
        trajectories=[{"title": t, "body": b} for t, b in data.get("trajectories", [])],
    )
    path = out / "report.html"
    path.write_text(page)
    return path


def _markup(s: str) -> Any:
    from markupsafe import Markup

    return Markup(s)
