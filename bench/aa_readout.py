"""Does the canary readout roll back or promote on noise? The loop's whole decision rule (hack
alarms, guardrails, primary metric: `etude.loop.readout.loop_rule`) on real A/A traffic, under the
rule before stop 45 ("old": guardrails fail while the fixed-horizon interval reaches past the
margin, alarms fire on a threshold alone) and the current one ("new": both need always-valid
evidence, at alpha divided by their number).

The traffic: the per-user A/B rows of the A/A cycle in bench/results/realtime.json (issue 32's
bench: 16 simulated users of org acme on SmolLM2's warm start, production against an identity
adapter, so both arms are the same model). That cycle was rolled back by the `dissatisfied_rate`
guardrail. Here:
1. `actual.<rule>`: that cycle's own readout, re-decided under each rule (records `actual`);
2. `<rule>.aa_false_*`: `--splits` re-randomisations of its users into two arms at the configured
   weights (`etude.experiments.aa.rerandomised`, seeded), each decided by the loop's rule: the share
   that promoted, that rolled back on a guardrail, on a hack alarm, or at all. On A/A traffic every
   promotion and every rollback is false; issue 46 asks for each to be at most alpha.
The canary and alarm settings are configs/loop_demo.toml's (the config that cycle ran).

    .venv/bin/python bench/aa_readout.py [--splits 400] [--out bench/results/aa_readout.json]

Not guaranteed: that other traffic behaves like this window (16 users, 8 an arm); the alarms are
fixed thresholds on pooled ratios, not tests, so their rate depends on the window's size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from etude.evals.results import write_result
from etude.experiments.aa import rerandomised
from etude.experiments.analysis import analyze
from etude.loop.config import LoopConfig
from etude.loop.readout import ab_config, loop_rule
from etude.provenance import provenance

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "source": "str",
    "config": "str",
    "users": "int",
    "splits": "int",
    "alpha": "float",
    "actual": "dict",
    "rates": "dict",
    "rules": "dict",
}

ROOT = Path(__file__).resolve().parents[1]
# "old": the rule before stop 45 (guardrails fail without evidence of no harm, alarms on a threshold
# alone); "new": guardrails and alarms both need always-valid evidence (alpha / their number)
RULES = {"old": ("noninferiority", "threshold"), "new": ("sequential", "sequential")}
OUTCOMES = ("promote", "guardrail", "alarm", "other_rollback")


def aa_rows(records_path: Path, scenario: str = "aa") -> list[dict]:
    """The per-user A/B rows of one scenario of a realtime bench's records."""
    rows = [r for r in map(json.loads, records_path.read_text().splitlines())
            if r.get("record") == "ab" and r.get("scenario") == scenario]
    if not rows:
        raise SystemExit(f"aa_readout: {records_path} holds no A/B rows of scenario {scenario!r}")
    return [{k: r[k] for k in ("user_id", "arm", "metric", "numerator", "denominator", "ts")} for r in rows]


def with_rule(cfg: LoopConfig, rule: str) -> LoopConfig:
    guardrails, alarms = RULES[rule]
    return dataclasses.replace(cfg, canary=dataclasses.replace(cfg.canary, guardrail_rule=guardrails),
                               alarms=dataclasses.replace(cfg.alarms, evidence=alarms))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=str(ROOT / "bench" / "results" / "realtime.records.jsonl"))
    ap.add_argument("--config", default=str(ROOT / "configs" / "loop_demo.toml"))
    ap.add_argument("--splits", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "aa_readout.json"))
    a = ap.parse_args(argv)
    t0 = time.time()
    rows = aa_rows(Path(a.source))
    base = LoopConfig.from_toml(a.config)
    records, actual, rates, stages = [], {}, {}, {}
    for rule in RULES:
        t = time.time()
        cfg = with_rule(base, rule)
        verdict, reason = loop_rule(cfg)({"ab": analyze(rows, ab_config(cfg)), "rows": rows})
        actual[rule] = {"decision": verdict, "reason": reason}
        records.append({"record": "actual", "rule": rule, "rollback": int(verdict == "rollback"),
                        "promote": int(verdict == "promote"), "guardrail": int(reason.startswith("guardrail failed"))})
        res = rerandomised(rows, loop_rule(cfg), ab_config(cfg), a.splits, a.seed)
        for o in res["outcomes"]:
            records.append({"record": "split", "rule": rule, "split": o["split"], "outcome": o["outcome"],
                            **{k: int(o["outcome"] == k) for k in OUTCOMES},
                            "rollback": int(o["outcome"] in ("guardrail", "alarm", "other_rollback"))})
        rates[rule] = {k: res[k]["rate"] for k in ("false_promotion", "false_guardrail_rollback", "false_alarm_rollback")}
        stages[rule] = round(time.time() - t, 2)
        print(f"{rule}: actual {verdict} ({reason[:80]}); over {a.splits} A/A splits: {rates[rule]}")
    figures = {}
    for rule in RULES:
        split = {"record": "split", "rule": rule}
        figures[f"{rule}.aa_false_promotion_rate"] = {"kind": "rate", "of": split, "field": "promote"}
        figures[f"{rule}.aa_false_guardrail_rollback_rate"] = {"kind": "rate", "of": split, "field": "guardrail"}
        figures[f"{rule}.aa_false_alarm_rollback_rate"] = {"kind": "rate", "of": split, "field": "alarm"}
        figures[f"{rule}.aa_false_rollback_rate"] = {"kind": "rate", "of": split, "field": "rollback"}
        figures[f"actual.{rule}.guardrail_rollback"] = {"kind": "rate", "of": {"record": "actual", "rule": rule},
                                                        "field": "guardrail"}
    meta = {"what": "the loop's decision rule on re-randomised A/A traffic: old (noninferiority guardrails, "
                    "threshold alarms) and new (always-valid evidence for both) rules",
            "source": str(Path(a.source).relative_to(ROOT)) if Path(a.source).is_relative_to(ROOT) else a.source,
            "config": str(Path(a.config).relative_to(ROOT)) if Path(a.config).is_relative_to(ROOT) else a.config,
            "users": len({r["user_id"] for r in rows}), "splits": a.splits, "alpha": base.canary.alpha,
            "actual": actual, "rates": rates, "rules": {k: {"guardrails": g, "alarms": al} for k, (g, al) in RULES.items()}}
    write_result(Path(a.out), figures, records, provenance(seeds={"splits": a.seed}, started=t0, stages=stages),
                 meta=meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
