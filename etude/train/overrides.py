"""`--set key=value` overrides shared by `etude train` and `etude sft`."""

from __future__ import annotations

import json

from etude.errors import EtudeError


def parse_set(items: list[str]) -> dict[str, object]:
    """["steps=3", "loss.kl_coef=0.1", "model=tiny"] → {"steps": 3, ...}; values are JSON, else strings."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise EtudeError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare string
    return out
