"""The options `etude train` and `etude sft` share — `--config FILE [--out DIR] [--set key=value ...]
[--allow-test-split]` — and the overrides they make. The `--set` parser lives in etude.configfile
(every component's loader applies its result the same way)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from etude.configfile import parse_set

__all__ = ["ConfigOpt", "OutOpt", "SetOpt", "TestSplitOpt", "parse_set", "run_dir", "run_overrides"]


def ConfigOpt(what: str, example: str) -> Any:  # noqa: N802 - a type, as it is used
    return Annotated[Path, typer.Option("--config", help=f"TOML {what} config (see {example}).")]


OutOpt = Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/<config name>).")]


def SetOpt(example: str) -> Any:  # noqa: N802 - a type, as it is used
    return Annotated[list[str] | None, typer.Option("--set", help=f"Override a key: {example}")]


def TestSplitOpt(what: str) -> Any:  # noqa: N802 - a type, as it is used
    return Annotated[bool, typer.Option("--allow-test-split", help=f"{what} on sealed test-split packages anyway; "
                                        "the run is marked contaminated.")]


def run_overrides(set_: list[str] | None, allow_test_split: bool) -> dict[str, Any]:
    """The `--set` overrides, with `allow_test_split = true` when the flag is given."""
    overrides = parse_set(set_ or [])
    if allow_test_split:
        overrides["allow_test_split"] = True
    return overrides


def run_dir(out: Path | None, config: Path) -> Path:
    """`--out`, else runs/<config name>."""
    return out or Path("runs") / config.stem
