"""Result files that can be checked: a bench script's figures, the per-task records they summarise,
and where they came from, written together; `bench/verify.py` recomputes the figures.

The convention (one, for every file under `bench/results/` except `legacy/`):
- `<stem>.json` — an object with
  - `provenance`: `etude.provenance.provenance(...)` (git commit and dirty flag, command line,
    seeds, machine, start and end times, stages);
  - `records`: {"file": "<stem>.records.jsonl", "count": N, "sha256": HEX} — the records file
    beside it and its digest (an edited or swapped records file fails verification);
  - `figures`: {NAME: FIGURE}, every headline figure, each a spec (what it is computed from) plus
    the values computed from the records (see `KINDS`); nothing else is allowed in a figure;
  - `meta` (optional): settings and context the script wants to keep; not verified.
- `<stem>.records.jsonl` — one JSON object per line, flat: the per-task (per-answer, per-step)
  outcomes, e.g. {"arm": "sft", "task": "isodate-3", "resolved": 1}.

A selection (`of`, `a`, `b`, `num`, `den`) is {FIELD: VALUE, ...}: the records whose fields equal
those values. Figure kinds:
- `rate` {of, field}: k = Σ field (0/1), n, rate = k/n, Wilson 95% interval (`ci_low`, `ci_high`).
- `mean` {of, field}: n, mean, ci_low, ci_high (`stats.mean_ci`: Wilson for 0/1 values, else the
  seeded percentile bootstrap).
- `quantile` {of, field, q}: n, value = the q-quantile of the field (`stats.quantile`: linear
  between order statistics; q = 0.5 is the median, 0.95 the p95).
- `ratio` {num, den, field, stat}: value = stat(num) / stat(den), with both (`num_value`,
  `den_value`); stat is "mean" (default), "median", "pNN" (the NN-th percentile, e.g. "p95") or
  "rate" (events per unit of `field` = len(values) / max(values), for records that each hold when
  their event ended since a common start: a load phase's requests per second, bench/serve.py);
  `den_field` (optional) reads the denominator from another field of the records (two rules'
  rejection rates on the same simulated experiments).
  A speed result puts the peer's figure beside ours this way: both medians and their ratio.
- `ratio_reps` {num, den, field, by[, stat]}: the same ratio within each repetition (the records
  of num and den that share a value of field `by`, e.g. "rep" of a bench that interleaves two
  engines): n_reps (repetitions both sides have), the median of the per-repetition ratios, its
  seeded percentile-bootstrap 95% interval (`stats.bootstrap_ci` of the median: ci_low, ci_high), min
  and max. A peer comparison's ratio is claimed only where this interval holds.
- `difference` {a, b, field, stat}: value = stat(b) − stat(a), with both (`a_value`, `b_value`),
  stat as for `ratio` (e.g. the sandbox's start-up overhead: median sandboxed − median bare).
- `paired` {a, b, key, field}: 0/1 outcomes matched on `key` (each key once per arm, the same keys
  in both): n, a_k, b_k, a_rate, b_rate, gain = (b_k − a_k)/n, b_only, a_only, p (exact McNemar).
- `noninferiority` {a, b, key, field, margin[, alpha]}: values averaged per `key` in each arm, then
  `stats.paired_noninferiority(a, b, margin)` (B no worse than A by more than margin): n, mean_a,
  mean_b, mean_diff, sd_diff, lower_bound, p, noninferior, power_at_margin, n_for_power.
- `paired_mean` {a, b, key, field[, cluster]}: continuous values matched on `key` (each key once
  per arm): n, mean_a, mean_b, mean_diff = mean(b − a), its 95% seeded bootstrap interval (ci_low,
  ci_high) and the two-sided Wilcoxon signed-rank p (`stats.paired_mean_diff`); with `cluster` (a
  field of arm a's records, e.g. the commit a held-out line came from) the bootstrap resamples
  clusters and the test runs on the clusters' mean differences (n_clusters of them).
- `ab` {of, metric[, alpha, mde, power, weights]}: the A/B readout of one ratio metric over the
  selected per-user rows (user_id, arm "control"|"treatment", metric, numerator, denominator, and
  `ts` for the order of looks) — `etude.experiments.analysis.analyze_metric` under an `ABConfig` of
  those settings: users_control, users_treatment, each arm's ratio (control, treatment), the
  relative lift `delta` with its delta-method 95% interval (ci_low, ci_high) and z-test p_value,
  and the mSPRT's always-valid msprt_p, msprt_ci_low, msprt_ci_high (None where an arm has too
  few users).
Any figure may carry `family` (a name): the figures of one family are comparisons on one held-out
set; each then gets `comparisons` (how many) and `p_holm` (`stats.holm` over the family's p).

Matching "beyond rounding": integers and booleans must be equal; a stored float must be within a
relative 1e-9 of the recomputed value (library versions), or be it rounded to at least 3
significant digits: within half a unit of its own last place (0.0254 stands for 3/118 = 0.02542;
0.2 does not stand for 0.2188). `write_result` stores full floats.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import re
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals import stats
from etude.experiments.analysis import ABConfig, analyze_metric

RECORDS_SUFFIX = ".records.jsonl"
MIN_DIGITS = 3  # a rounded float keeps at least this many significant digits
LEGACY_DIR = "legacy"

# spec keys per kind (required, optional) and the values computed from the records
KINDS: dict[str, tuple[set[str], set[str], set[str]]] = {
    "rate": ({"of", "field"}, set(), {"k", "n", "rate", "ci_low", "ci_high"}),
    "mean": ({"of", "field"}, set(), {"n", "mean", "ci_low", "ci_high"}),
    "quantile": ({"of", "field", "q"}, set(), {"n", "value"}),
    "ratio": ({"num", "den", "field"}, {"stat", "den_field"}, {"n_num", "n_den", "num_value", "den_value", "value"}),
    "ratio_reps": ({"num", "den", "field", "by"}, {"stat"}, {"n_reps", "median", "ci_low", "ci_high", "min", "max"}),
    "difference": ({"a", "b", "field"}, {"stat"}, {"n_a", "n_b", "a_value", "b_value", "value"}),
    "paired": ({"a", "b", "key", "field"}, set(),
               {"n", "a_k", "b_k", "a_rate", "b_rate", "gain", "b_only", "a_only", "p"}),
    "noninferiority": ({"a", "b", "key", "field", "margin"}, {"alpha"},
                       {"test", "n", "mean_a", "mean_b", "mean_diff", "sd_diff", "lower_bound", "p", "noninferior",
                        "power_at_margin", "n_for_power", "power_target"}),
    "paired_mean": ({"a", "b", "key", "field"}, {"cluster"},
                    {"n", "n_clusters", "mean_a", "mean_b", "mean_diff", "ci_low", "ci_high", "p"}),
    "ab": ({"of", "metric"}, {"alpha", "mde", "power", "weights", "min_look_users"},
           {"users_control", "users_treatment", "control", "treatment", "delta", "ci_low", "ci_high", "p_value",
            "msprt_p", "msprt_ci_low", "msprt_ci_high"}),
}
AB_ROW = ("user_id", "arm", "metric", "numerator", "denominator")
COMMON = {"kind", "family", "comparisons", "p_holm"}


def _rate(vals: Sequence[float]) -> float:
    """Events per unit of time: how many, over the latest end (each value = when one event ended)."""
    top = max(vals)
    return len(vals) / top if top > 0 else math.nan




class ResultError(ValueError):
    """A result file that does not follow the convention, or a figure that cannot be computed."""


def records_path(json_path: Path) -> Path:
    return json_path.with_name(json_path.name.removesuffix(".json") + RECORDS_SUFFIX)


def _select(records: Sequence[Mapping[str, Any]], sel: Any, name: str) -> list[Mapping[str, Any]]:
    if not isinstance(sel, Mapping):
        raise ResultError(f"figure {name}: a selection must be an object {{FIELD: VALUE}}, got {sel!r}")
    return [r for r in records if all(r.get(k) == v for k, v in sel.items())]


def _values(rows: Sequence[Mapping[str, Any]], field: str, name: str) -> list[float]:
    try:
        return [float(r[field]) for r in rows]
    except KeyError:
        raise ResultError(f"figure {name}: a selected record has no field {field!r}") from None
    except (TypeError, ValueError):
        raise ResultError(f"figure {name}: field {field!r} holds a value that is not a number") from None


def _binary(vals: Sequence[float], name: str) -> list[int]:
    if not stats.is_binary(vals):
        raise ResultError(f"figure {name}: kind needs 0/1 values")
    return [int(v) for v in vals]


def _by_key(rows: Sequence[Mapping[str, Any]], key: str, field: str, name: str, *, once: bool) -> dict[Any, float]:
    groups: dict[Any, list[float]] = {}
    for r in rows:
        if key not in r:
            raise ResultError(f"figure {name}: a selected record has no key field {key!r}")
        groups.setdefault(r[key], []).extend(_values([r], field, name))
    if once and any(len(v) > 1 for v in groups.values()):
        dup = next(k for k, v in groups.items() if len(v) > 1)
        raise ResultError(f"figure {name}: key {dup!r} appears more than once in an arm")
    return {k: sum(v) / len(v) for k, v in groups.items()}


def _pairs(fig: Mapping[str, Any], records: Sequence[Mapping[str, Any]], name: str, *, once: bool):
    a = _by_key(_select(records, fig["a"], name), fig["key"], fig["field"], name, once=once)
    b = _by_key(_select(records, fig["b"], name), fig["key"], fig["field"], name, once=once)
    if set(a) != set(b):
        only = sorted(map(str, set(a) ^ set(b)))[:3]
        raise ResultError(f"figure {name}: arms a and b hold different keys (e.g. {', '.join(only)})")
    keys = sorted(a, key=str)
    return [a[k] for k in keys], [b[k] for k in keys]


def _stat_fn(stat: Any, name: str):
    """mean, median or pNN (the NN-th percentile) of a list of values."""
    if stat == "mean":
        return statistics.mean
    if stat == "median":
        return statistics.median
    if stat == "rate":
        return _rate
    if isinstance(stat, str) and stat.startswith("p"):
        try:
            pct = float(stat[1:])
        except ValueError:
            pct = -1.0
        if 0 <= pct <= 100:
            return lambda v: stats.quantile(v, pct / 100)
    raise ResultError(f"figure {name}: stat must be mean, median, rate or pNN (a percentile, e.g. p95), "
                      f"got {stat!r}")


def compute_figure(fig: Mapping[str, Any], records: Sequence[Mapping[str, Any]], name: str = "?") -> dict[str, Any]:
    """The values of one figure spec, computed from the records (the spec keys are not returned)."""
    kind = fig.get("kind")
    if kind not in KINDS:
        raise ResultError(f"figure {name}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    required, optional, _ = KINDS[kind]
    missing = required - set(fig)
    if missing:
        raise ResultError(f"figure {name}: {kind} needs {', '.join(sorted(missing))}")
    if kind in ("rate", "mean"):
        vals = _values(_select(records, fig["of"], name), fig["field"], name)
        if not vals:
            raise ResultError(f"figure {name}: the selection {fig['of']} holds no records")
        if kind == "rate":
            k, n = sum(_binary(vals, name)), len(vals)
            low, high = stats.wilson_ci(k, n)
            return {"k": k, "n": n, "rate": k / n, "ci_low": low, "ci_high": high}
        m = stats.mean_ci(vals)
        return {"n": m["n"], "mean": m["mean"], "ci_low": m["ci_low"], "ci_high": m["ci_high"]}
    if kind == "quantile":
        vals = _values(_select(records, fig["of"], name), fig["field"], name)
        if not vals:
            raise ResultError(f"figure {name}: the selection {fig['of']} holds no records")
        q = fig["q"]
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
            raise ResultError(f"figure {name}: q must be a number in [0, 1], got {q!r}")
        return {"n": len(vals), "value": stats.quantile(vals, float(q))}
    if kind in ("ratio", "difference"):
        f = _stat_fn(fig.get("stat", "mean"), name)
        one, two = ("num", "den") if kind == "ratio" else ("a", "b")
        x = _values(_select(records, fig[one], name), fig["field"], name)
        y = _values(_select(records, fig[two], name), fig.get("den_field", fig["field"]), name)
        if not x or not y:
            raise ResultError(f"figure {name}: an empty selection")
        if fig.get("stat") == "rate" and min(*x, *y) < 0:
            raise ResultError(f"figure {name}: stat rate needs times since a common start (>= 0) in {fig['field']!r}")
        xv, yv = f(x), f(y)
        if kind == "difference":
            return {"n_a": len(x), "n_b": len(y), "a_value": xv, "b_value": yv, "value": yv - xv}
        return {"n_num": len(x), "n_den": len(y), "num_value": xv, "den_value": yv,
                "value": xv / yv if yv else math.nan}
    if kind == "ratio_reps":
        return _ratio_reps(fig, records, name)
    if kind == "paired":
        av, bv = _pairs(fig, records, name, once=True)
        a, b = _binary(av, name), _binary(bv, name)
        s = stats.paired_summary(a, b)
        n = len(a)
        return {"n": n, "a_k": sum(a), "b_k": sum(b), "a_rate": sum(a) / max(1, n), "b_rate": sum(b) / max(1, n),
                "gain": s["gain_points"], "b_only": s["b_only"], "a_only": s["a_only"], "p": s["mcnemar_p"]}
    if kind == "ab":
        return _ab(fig, records, name)
    if kind == "paired_mean":
        return _paired_mean(fig, records, name)
    av, bv = _pairs(fig, records, name, once=False)
    ni = stats.paired_noninferiority(av, bv, float(fig["margin"]), alpha=float(fig.get("alpha", 0.05)))
    return {"mean_a": statistics.mean(av) if av else None, "mean_b": statistics.mean(bv) if bv else None,
            **{k: v for k, v in ni.items() if k not in ("margin", "alpha")}}


def _ratio_reps(fig: Mapping[str, Any], records: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    f, by = _stat_fn(fig.get("stat", "mean"), name), fig["by"]
    num, den = _select(records, fig["num"], name), _select(records, fig["den"], name)
    if any(by not in r for r in (*num, *den)):
        raise ResultError(f"figure {name}: a selected record has no repetition field {by!r}")
    reps = sorted({r[by] for r in num} & {r[by] for r in den}, key=str)
    if not reps:
        raise ResultError(f"figure {name}: no repetition ({by}) holds records on both sides")
    ratios = []
    for rep in reps:
        x = _values([r for r in num if r[by] == rep], fig["field"], name)
        y = _values([r for r in den if r[by] == rep], fig["field"], name)
        if fig.get("stat") == "rate" and min(*x, *y) < 0:
            raise ResultError(f"figure {name}: stat rate needs times since a common start (>= 0) in {fig['field']!r}")
        yv = f(y)
        ratios.append(f(x) / yv if yv else math.nan)
    low, high = stats.bootstrap_ci(ratios, statistic="median")
    return {"n_reps": len(reps), "median": statistics.median(ratios), "ci_low": low, "ci_high": high,
            "min": min(ratios), "max": max(ratios)}


def _paired_mean(fig: Mapping[str, Any], records: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    av, bv = _pairs(fig, records, name, once=True)
    clusters = None
    if fig.get("cluster") is not None:
        rows = _select(records, fig["a"], name)
        of = {r[fig["key"]]: r.get(fig["cluster"]) for r in rows}
        if any(v is None for v in of.values()):
            raise ResultError(f"figure {name}: a selected record has no cluster field {fig['cluster']!r}")
        clusters = [of[k] for k in sorted(of, key=str)]
    return stats.paired_mean_diff(av, bv, clusters)


def _ab(fig: Mapping[str, Any], records: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    rows = _select(records, fig["of"], name)
    if not rows:
        raise ResultError(f"figure {name}: the selection {fig['of']} holds no records")
    missing = next((k for r in rows for k in AB_ROW if k not in r), None)
    if missing is not None:
        raise ResultError(f"figure {name}: a selected record has no field {missing!r} (ab needs {', '.join(AB_ROW)})")
    try:
        cfg = ABConfig(alpha=float(fig.get("alpha", 0.05)), weights=tuple(fig.get("weights", (0.5, 0.5))),
                       mde=fig.get("mde"), power=float(fig.get("power", 0.8)),
                       min_look_users=int(fig.get("min_look_users", 0)))
        m = analyze_metric([dict(r) for r in rows], str(fig["metric"]), cfg)
    except (EtudeError, TypeError, ValueError) as e:
        raise ResultError(f"figure {name}: {e}") from None
    return {"users_control": m["users"]["control"], "users_treatment": m["users"]["treatment"],
            **{k: m.get(k) for k in ("control", "treatment", "delta", "ci_low", "ci_high", "p_value", "msprt_p",
                                     "msprt_ci_low", "msprt_ci_high")}}


def compute_figures(figures: Mapping[str, Mapping[str, Any]],
                    records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every figure's spec with its computed values, and per `family` the count and Holm's p."""
    out: dict[str, dict[str, Any]] = {}
    for name, fig in figures.items():
        if not isinstance(fig, Mapping):
            raise ResultError(f"figure {name}: not an object")
        kind = fig.get("kind")
        required, optional, computed = KINDS.get(kind, (set(), set(), set()))
        unknown = set(fig) - required - optional - computed - COMMON
        if kind in KINDS and unknown:
            raise ResultError(f"figure {name}: field(s) {', '.join(sorted(unknown))} are not computed from the "
                              "records (no hand-written fields in a figure; put context under meta)")
        if fig.get("family") is None and ({"comparisons", "p_holm"} & set(fig)):
            raise ResultError(f"figure {name}: comparisons/p_holm without a family")
        spec = {k: v for k, v in fig.items() if k in required | optional | {"kind", "family"}}
        out[name] = spec | compute_figure(fig, records, name)
    families: dict[str, list[str]] = {}
    for name, fig in out.items():
        if fig.get("family") is not None:
            families.setdefault(str(fig["family"]), []).append(name)
    for fam, names in families.items():
        ps = [out[n].get("p") for n in names]
        if any(p is None for p in ps):
            raise ResultError(f"family {fam}: every member needs a p value ({', '.join(names)})")
        for n, adj in zip(names, stats.holm(ps), strict=True):
            out[n]["comparisons"], out[n]["p_holm"] = len(names), adj
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return x


def write_result(path: Path | str, figures: Mapping[str, Mapping[str, Any]], records: Iterable[Mapping[str, Any]],
                 provenance: Mapping[str, Any], *, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write `<stem>.json` and `<stem>.records.jsonl` together (see the module doc). `figures` are
    specs; their values are computed here from `records` (a value the caller passes must agree,
    else ResultError). `provenance` is `etude.provenance.provenance(...)`. Returns the document."""
    path = Path(path)
    if path.suffix != ".json":
        raise ResultError(f"a result file is <stem>.json, got {path.name}")
    if not provenance or "git_commit" not in provenance or "command" not in provenance:
        raise ResultError("provenance must come from etude.provenance.provenance(...)")
    recs = [_jsonable(dict(r)) for r in records]
    computed = compute_figures(figures, recs)
    for name, fig in figures.items():
        for k, v in fig.items():
            if k in computed[name] and not _agrees(v, computed[name][k]):
                raise ResultError(f"figure {name}.{k}: given {v!r}, the records give {computed[name][k]!r}")
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs)
    rpath = records_path(path)
    doc: dict[str, Any] = {
        "provenance": _jsonable(dict(provenance)),
        "records": {"file": rpath.name, "count": len(recs), "sha256": hashlib.sha256(text.encode()).hexdigest()},
        "figures": _jsonable(computed),
    }
    if meta:
        doc["meta"] = _jsonable(dict(meta))
    path.parent.mkdir(parents=True, exist_ok=True)
    for p, body in ((rpath, text), (path, json.dumps(doc, indent=1) + "\n")):  # records first: the JSON names them
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(body)
        tmp.replace(p)
    return doc


def _agrees(stored: Any, computed: Any) -> bool:
    if stored is None or computed is None:
        return stored is None and (computed is None or (isinstance(computed, float) and math.isnan(computed)))
    if isinstance(stored, bool) or isinstance(computed, bool):
        return isinstance(stored, bool) and isinstance(computed, bool) and stored == computed
    if isinstance(stored, str) or isinstance(computed, str):
        return stored == computed
    if isinstance(stored, int) and isinstance(computed, int):
        return stored == computed
    try:
        s, c = float(stored), float(computed)
    except (TypeError, ValueError):
        return stored == computed
    if math.isnan(c):
        return math.isnan(s)
    if math.isclose(s, c, rel_tol=1e-9, abs_tol=1e-12):
        return True
    if isinstance(stored, int):  # an integer where a float is computed: exact only
        return False
    t = Decimal(repr(s)).as_tuple()
    if not isinstance(t.exponent, int) or len(t.digits) < MIN_DIGITS:  # 0.2 for 0.2188 is an edit, not rounding
        return False
    return abs(s - c) <= 0.5 * 10.0 ** t.exponent * (1 + 1e-9)


TOP_LEVEL = ("provenance", "records", "figures", "meta")
# meta keys that state a result in words or numbers verify cannot recompute: refused at any depth
_CLAIM_KEY = re.compile(r"(^|_)(headline|claims?|claimed|conclusion|verdict_text)$", re.I)


def _claims(meta: Any, at: str = "meta", names_terms: bool = False) -> list[str]:
    """Paths of claim-like keys in `meta` (see `_CLAIM_KEY`). The keys of a `*weights` table
    (`weights`, `distill_weights`) name reward terms (`unsupported_claims` is one), not claims."""
    if isinstance(meta, dict):
        return [p for k, v in meta.items()
                for p in ([f"{at}.{k}"] if _CLAIM_KEY.search(str(k)) and not names_terms else [])
                + _claims(v, f"{at}.{k}", str(k).endswith("weights"))]
    if isinstance(meta, list):
        return [p for i, v in enumerate(meta) for p in _claims(v, f"{at}[{i}]")]
    return []


PROJECT = Path(__file__).resolve().parents[2]  # the checkout whose bench/ and etude/ wrote the results
_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                       "dict": (dict,), "list": (list,), "null": (type(None),)}


def script_of(command: Any) -> str | None:
    """The script a result's provenance command ran, relative to the project: the first `*.py`
    argument, or etude/demo/run.py for `etude demo`."""
    words = command if isinstance(command, list) else str(command or "").split()
    if words[:2] == ["etude", "demo"]:
        return "etude/demo/run.py"
    return next((w for w in words if w.endswith(".py")), None)


def declared_schema(script: Path) -> dict[str, str] | None:
    """The script's `META_SCHEMA = {key: "type[|type]"}` literal (read, not imported), or None."""
    try:
        tree = ast.parse(script.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                       and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "META_SCHEMA" and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def schema_problems(meta: Any, schema: dict[str, str], script: str) -> list[str]:
    """meta's keys that `schema` does not declare, or whose value is not of a declared type."""
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return ["meta is not an object"]
    out = []
    for k, v in meta.items():
        if k not in schema:
            out.append(f"meta.{k}: not in {script}'s META_SCHEMA (a field its script does not write is not verified)")
            continue
        kinds = str(schema[k]).split("|")
        if not any(isinstance(v, _TYPES.get(t, ())) and not (t in ("int", "float") and isinstance(v, bool))
                   for t in kinds):
            out.append(f"meta.{k}: a {type(v).__name__}, {script}'s META_SCHEMA says {schema[k]}")
    return out


@functools.lru_cache(maxsize=64)
def _full_history(repo: str) -> bool:
    """Whether `repo` is in a git repository with its whole history (asked once per folder: every
    result file in it shares the answer)."""
    try:
        r = subprocess.run(["git", "-C", repo, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip() == "false"


def commit_exists(commit: Any, repo: Path) -> bool | None:
    """Whether `commit` names a commit of the git repository at `repo` (None: cannot tell — no git,
    not a repository, or a shallow clone whose history is cut)."""
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{7,40}", commit) or not commit.strip("0"):
        return False
    if not _full_history(str(repo)):
        return None
    try:
        r = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.returncode == 0


def check_result(path: Path) -> list[str]:
    """Problems of one result file (empty: verified), each naming the file and, for a figure,
    the field with its stored and recomputed values. Beyond the figures: no top-level key but
    provenance, records, figures and meta; no claim-like key in meta (`_claims`); and the
    provenance's commit must exist in the repository holding the file."""
    where = str(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return [f"{where}: cannot read JSON ({e})"]
    if not isinstance(doc, dict):
        return [f"{where}: not a JSON object"]
    problems = [f"{where}: top-level {k!r}: not verified (a result file holds only {', '.join(TOP_LEVEL)}; a figure "
                "goes under figures, computed from the records)" for k in doc if k not in TOP_LEVEL]
    problems += [f"{where}: {p}: a claim in meta is not verified (state it as a figure computed from the records)"
                 for p in _claims(doc.get("meta"))]
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or "git_commit" not in prov or "command" not in prov:
        problems.append(f"{where}: no provenance (a file written by hand or before the seal: regenerate it with "
                        f"etude.evals.results.write_result, or move it to {LEGACY_DIR}/)")
    else:
        if commit_exists(prov["git_commit"], path.resolve().parent) is False:
            problems.append(f"{where}: provenance.git_commit {prov['git_commit']!r} is not a commit of this repository")
        script = script_of(prov.get("command"))
        schema = declared_schema(PROJECT / script) if script else None
        if schema is not None:
            problems += [f"{where}: {p}" for p in schema_problems(doc.get("meta"), schema, script)]
    rec = doc.get("records")
    rpath = records_path(path)
    if not isinstance(rec, dict) or rec.get("file") != rpath.name:
        problems.append(f"{where}: records: expected {{\"file\": \"{rpath.name}\", ...}}, got {rec!r}")
        return problems
    try:
        text = rpath.read_text()
    except OSError as e:
        return [*problems, f"{where}: records file {rpath.name}: {e.strerror or e}"]
    digest = hashlib.sha256(text.encode()).hexdigest()
    if rec.get("sha256") != digest:
        problems.append(f"{where}: records.sha256: stored {rec.get('sha256')}, recomputed {digest} "
                        f"({rpath.name} changed after it was written)")
    try:
        records = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    except json.JSONDecodeError as e:
        return [*problems, f"{where}: {rpath.name}: not JSON lines ({e})"]
    if rec.get("count") != len(records):
        problems.append(f"{where}: records.count: stored {rec.get('count')}, recomputed {len(records)}")
    figs = doc.get("figures")
    if not isinstance(figs, dict) or not figs:
        return [*problems, f"{where}: figures: none (a result file states its figures under 'figures')"]
    try:
        computed = compute_figures(figs, records)
    except ResultError as e:
        return [*problems, f"{where}: {e}"]
    for name, fig in figs.items():
        for k, c in computed[name].items():
            if k not in fig:
                problems.append(f"{where}: figure {name}.{k}: missing, recomputed {c!r}")
            elif not _agrees(fig[k], c):
                problems.append(f"{where}: figure {name}.{k}: stored {fig[k]!r}, recomputed {c!r}")
    return problems


def verify_dir(results: Path) -> tuple[list[Path], list[Path], dict[Path, list[str]]]:
    """(checked files, skipped legacy files, {file: problems} for the files that failed) for every
    `*.json` under `results`, subfolders included, except under `results/legacy/` (skipped, counted)."""
    checked, skipped, failed = [], [], {}
    for p in sorted(results.rglob("*.json")):
        if p.relative_to(results).parts[0] == LEGACY_DIR:
            skipped.append(p)
            continue
        checked.append(p)
        found = check_result(p)
        if found:
            failed[p] = found
    return checked, skipped, failed
