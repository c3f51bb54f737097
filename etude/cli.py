"""`etude …` commands. This file holds no logic: each component registers its own commands.

A component adds commands by exposing `register(app: typer.Typer) -> None` in
`etude/<component>/cli.py`. Those modules import only typer/rich at top level (heavy imports go
inside the command functions) so `etude --help` and `etude tool …` start fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import typer

from etude import __version__
from etude.errors import EtudeError

# Order is the order of `etude --help`.
COMPONENTS = (
    "sandbox",
    "tools",
    "search",
    "harness",
    "tasks",
    "envs",
    "policy",
    "train",
    "evals",
    "serve",
    "experiments",
    "loop",
    "pipeline",
    "demo",
)

app = typer.Typer(
    name="etude",
    help="Reinforcement learning for coding agents: sandboxes, tasks, rewards, trainer, serving, real-time loop.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command("version")
def version() -> None:
    """Print etude's version."""
    print(__version__)


# Which component owns each top-level command. A command listed here imports only its own
# component's CLI (so `etude tool …` does not pay for scipy or sqlalchemy); anything else —
# `--help`, a command not listed — registers every component.
COMMAND_OWNERS = {
    "sandbox": "sandbox",
    "tool": "tools",
    "search": "search",
    "parse": "harness",
    "agent": "harness",
    "agent-feedback": "harness",
    "tasks": "tasks",
    "grade": "envs",
    "train": "train",
    "model": "train",
    "eval": "evals",
    "serve": "serve",
    "keys": "serve",
    "registry": "serve",
    "experiment": "serve",
    "distill": "loop",
    "ab": "experiments",
    "loop": "loop",
    "specialise": "pipeline",
    "demo": "demo",
}


def _register(comp: str) -> None:
    name = f"etude.{comp}.cli"
    if importlib.util.find_spec(f"etude.{comp}") is None or importlib.util.find_spec(name) is None:
        return  # component not built yet
    importlib.import_module(name).register(app)


def _register_for(argv: list[str]) -> None:
    first = next((a for a in argv[1:] if not a.startswith("-")), None)
    owner = COMMAND_OWNERS.get(first or "")
    if owner and "--help" not in argv[1:2]:
        _register(owner)
    else:
        for comp in COMPONENTS:
            _register(comp)


_register_for(sys.argv)


def main() -> None:
    try:
        app()
    except EtudeError as e:
        print(f"etude: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("etude: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
