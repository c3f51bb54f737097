"""The decision rule of the canary, a pure function of the readout (documented in docs/loop.md).

In order, the first that applies wins:
1. no readout yet (an arm has no users)                        → keep collecting (None)
2. sample ratio mismatch (srm_ok false)                         → rollback: the split is broken
3. a hack alarm fired                                           → rollback
4. a guardrail failed (its worst plausible change past margin)  → rollback
5. primary metric: msprt_p < alpha and lift worse                → rollback (significantly worse)
6. primary metric: msprt_p < alpha and lift better                → promote
7. primary metric: the always-valid interval's bad end within -harm_margin → promote
8. otherwise                                                    → keep collecting (None); when the
   max window is spent the caller rolls back (the default is the safe side).
A promotion by 6 or 7 is held (keep collecting) while any hack alarm's indicator is past its
threshold without the evidence that would fire it (since stop 52): rolling back needs evidence,
promoting needs the warning signs absent. A candidate that quits at once drives repeat_rate to 0
and was promoted at 8 and 10 users an arm while its edit_rate had fallen 100% with an always-valid
p of 0.033 (bench/results/loop_hacks_2rounds.json).

Rule 7 reads the mSPRT's always-valid interval (`msprt_ci_low` / `msprt_ci_high`), not the
fixed-horizon one: the rule runs after every canary round, and checking a fixed-horizon interval
at every round is the naive peeking that inflates false promotions (bench/ab_simulation.py: 22% at
α = 0.05 over 20 looks). A readout without the always-valid interval never promotes by rule 7.

Gate-only (`gate_only`, when the canary's plan cannot be reached in the window, see
etude.loop.plan): no readout; promote only a gate that passed *and* measured an improvement
(non-inferiority alone would promote an unchanged copy); otherwise roll back.

The eval gate (`gated`): a required gate that was "inconclusive" (its interval could not exclude
harm) never promotes — a "promote" becomes a rollback that gives both reasons.
"""

from __future__ import annotations

from typing import Any

from etude.loop.metrics import past_threshold


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
    verdict, reason = _primary(ab, canary)
    held = [a for a in readout.get("alarms", []) if verdict == "promote" and past_threshold(a)]
    if held:  # rolling back needs evidence; promoting needs the warning signs absent
        return None, (f"promotion held: hack alarm {', '.join(a['metric'] for a in held)} past its threshold "
                      f"without always-valid evidence yet ({reason})")
    return verdict, reason


def _primary(ab: dict[str, Any], canary: Any) -> tuple[str | None, str]:
    m = ab["metrics"].get(canary.primary)
    if m is None or m.get("delta") is None:
        why = (m or {}).get("note", "no data")
        return None, f"primary metric {canary.primary}: {why}"
    lift, p = m["delta"], m["msprt_p"]
    desc = f"{canary.primary} lift {lift:+.1%} [{m['ci_low']:+.1%}, {m['ci_high']:+.1%}], msprt_p {p:.3g}"
    higher = canary.primary_higher_is_better
    gain = lift if higher else -lift
    av_low, av_high = m.get("msprt_ci_low"), m.get("msprt_ci_high")
    if p < canary.alpha and gain < 0:
        return "rollback", f"significantly worse: {desc}"
    if p < canary.alpha and gain > 0:
        return "promote", f"significantly better: {desc}"
    if av_low is not None and av_high is not None:
        worst = av_low if higher else -av_high  # the always-valid interval's bad end, as a gain
        if worst > -canary.harm_margin:
            return "promote", (f"always-valid interval [{av_low:+.1%}, {av_high:+.1%}] excludes harm "
                               f"(> -{canary.harm_margin:.0%}): {desc}")
    return None, f"not yet decisive: {desc}"


def gate_status(gate: dict[str, Any]) -> str:
    """"passed" | "failed" | "inconclusive" of an eval verdict (older verdicts: from gate_passed)."""
    if gate.get("gate") in ("passed", "failed", "inconclusive"):
        return str(gate["gate"])
    return "passed" if gate.get("gate_passed") else "failed"


def inconclusive_reason(gate: dict[str, Any]) -> str:
    metrics = ", ".join(gate.get("inconclusive") or []) or "?"
    return (f"inconclusive on {gate.get('tasks', '?')} task(s): the interval of {metrics} cannot exclude harm "
            f"beyond the margin")


def gated(verdict: str, reason: str, gate: dict[str, Any]) -> tuple[str, str]:
    """The final decision under a required eval gate: an inconclusive gate never promotes."""
    status = gate_status(gate)
    if status == "passed":
        return verdict, reason
    why = inconclusive_reason(gate) if status == "inconclusive" else f"failed: {', '.join(gate.get('regressions') or [])}"
    if verdict == "promote":
        return "rollback", f"not promoted: eval gate {why} (the readout said: {reason})"
    return verdict, f"{reason}; and the eval gate was {why}"


def gate_only(gate: dict[str, Any], why: str) -> tuple[str, str]:
    """The decision without a canary: the eval gate alone, labelled as such."""
    status, better = gate_status(gate), list(gate.get("improvements") or [])
    label = f"gate-only decision ({why})"
    if status == "passed" and better:
        return "promote", f"{label}: eval gate passed, better on {', '.join(better)} over {gate.get('tasks', '?')} task(s)"
    if status == "passed":
        return "rollback", f"{label}: eval gate passed but measured no improvement, and gate-only promotes only a gain"
    why_gate = inconclusive_reason(gate) if status == "inconclusive" else f"failed: {', '.join(gate.get('regressions') or [])}"
    return "rollback", f"{label}: eval gate {why_gate}"
