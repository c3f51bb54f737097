"""A/B experiment analysis: SRM, delta-method ratio metrics, CUPED, mSPRT, guardrails."""

from etude.experiments.analysis import ABConfig, Guardrail, analyze, load_events

__all__ = ["ABConfig", "Guardrail", "analyze", "load_events"]
