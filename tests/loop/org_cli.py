"""`etude loop --org` as a user runs it, and what it must leave untouched: shared by the org tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from etude.serve import registry
from etude.store import open_store

ROOT = Path(__file__).resolve().parents[2]


def registry_snapshot(db: str) -> tuple:
    """acme's checkpoints and experiments, and every org's experiments: what a refused cycle must not change."""
    store = open_store(db)
    return (tuple(registry.list_checkpoints(store, "acme")), tuple(registry.list_experiments(store, "acme")),
            tuple(registry.list_experiments(store, None)))


def loop_cli(cfg: Path, org: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etude.cli", "loop", "--config", str(cfg), "--org", org, "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
