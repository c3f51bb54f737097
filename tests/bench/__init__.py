"""Tests of the scripts under bench/ (each runs as a file, `python bench/NAME.py`: `load_bench` imports one
by its path, as that command would)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).parents[2] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
