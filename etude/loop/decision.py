"""The decision rule of the canary, a pure function of the readout (documented in docs/loop.md).

In order, the first that applies wins:
1. no readout yet (an arm has no users)                        → keep collecting (None)
2. sample ratio mismatch (srm_ok false)                         → rollback: the split is broken
3. a hack alarm fired                                           → rollback
4. a guardrail failed (its worst plausible change past margin)  → rollback
5. primary metric: msprt_p < alpha and lift worse                → rollback (significantly worse)
6. primary metric: msprt_p < alpha and lift better                → promote
7. primary metric: the interval's bad end within -harm_margin   → promote
8. otherwise                                                    → keep collecting (None); when the
   max window is spent the caller rolls back (the default is the safe side).
"""

from __future__ import annotations

from typing import Any


def decide(readout: dict[str, Any], canary: Any) -> tuple[str | None, str]:
    """-> ("promote" | "rollback" | None, reason)."""
    ab = readout.get("ab")
    if not ab:
        return None, "no readout yet: an arm has no users"
    if not ab.get("srm_ok", True):
        return "rollback", f"sample ratio mismatch (srm_p {ab['srm_p']:.2g})"
    fired = [a["metric"] for a in readout.get("alarms", []) if a.get("fired")]
    if fired:
        return "rollback", f"hack alarm: {', '.join(fired)}"
    failed = [g["metric"] for g in ab.get("guardrails", []) if g.get("ok") is False]
    if failed:
        return "rollback", f"guardrail failed: {', '.join(failed)}"
    return _primary(ab, canary)


def _primary(ab: dict[str, Any], canary: Any) -> tuple[str | None, str]:
    m = ab["metrics"].get(canary.primary)
    if m is None or m.get("delta") is None:
        why = (m or {}).get("note", "no data")
        return None, f"primary metric {canary.primary}: {why}"
    lift, p = m["delta"], m["msprt_p"]
    desc = f"{canary.primary} lift {lift:+.1%} [{m['ci_low']:+.1%}, {m['ci_high']:+.1%}], msprt_p {p:.3g}"
    higher = canary.primary_higher_is_better
    gain = lift if higher else -lift
    worst = m["ci_low"] if higher else -m["ci_high"]  # the interval's bad end, as a gain
    if p < canary.alpha and gain < 0:
        return "rollback", f"significantly worse: {desc}"
    if p < canary.alpha and gain > 0:
        return "promote", f"significantly better: {desc}"
    if worst > -canary.harm_margin:
        return "promote", f"interval excludes harm (> -{canary.harm_margin:.0%}): {desc}"
    return None, f"not yet decisive: {desc}"
