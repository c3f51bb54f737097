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

from etude.errors import EtudeError

# Order is the order of `etude --help`.
COMPONENTS = (
    "sandbox",
    "tools",
    "harness",
    "tasks",
    "envs",
    "policy",
    "train",
    "evals",
    "serve",
    "experiments",
    "loop",
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
    from etude import __version__

    print(__version__)


def _register_all() -> None:
    for comp in COMPONENTS:
        name = f"etude.{comp}.cli"
        if importlib.util.find_spec(f"etude.{comp}") is None or importlib.util.find_spec(name) is None:
            continue  # component not built yet
        importlib.import_module(name).register(app)


_register_all()


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
