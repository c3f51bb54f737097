"""`etude serve`, `etude keys …`, `etude registry …`, `etude experiment …` (logic lives elsewhere).

Every command that touches the store takes `--db URL` (default $ETUDE_DB, then
sqlite:///<ETUDE_HOME>/etude.db).
"""

from __future__ import annotations

import json
from typing import Any

import typer

from etude.errors import EtudeError
from etude.serve import ServeConfig, registry
from etude.serve import serve as run_server
from etude.store import open_store

DB = typer.Option(None, "--db", help="store URL (default $ETUDE_DB, then sqlite:///~/.etude/etude.db)")


def _store(db: str | None) -> Any:
    return open_store(db)


def _plain(obj: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _print(obj: Any) -> None:
    print(json.dumps(_plain(obj), indent=2, default=str))


def _serve_command(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        config: str | None = typer.Option(None, "--config", help="TOML file with a \\[serve] table (see docs/serve.md)"),
        model: str | None = typer.Option(None, "--model", help="'tiny', 'smollm2' or a model directory"),
        name: str | None = typer.Option(None, "--name", help="registry name for --model"),
        host: str | None = typer.Option(None, "--host"),
        port: int | None = typer.Option(None, "--port"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads for generation (default: torch's)"),
        backend: str | None = typer.Option(None, "--backend", help="hf (transformers) or vllm (needs `make setup-vllm`)"),
        precision: str | None = typer.Option(None, "--precision", help="fp32, bf16, fp8 or mxfp8 (fp8/mxfp8: torchao on GPUs with FP8/MXFP8 tensor cores)"),
        max_batch: int | None = typer.Option(None, "--max-batch", min=1, help="hf backend: requests generated together "
                                             "at most (vllm batches continuously, without this cap)"),
        db: str | None = DB,
    ) -> None:
        """Serve an OpenAI-compatible API (chat completions, tools, streaming) with the auto router."""
        cfg = ServeConfig.from_toml(config) if config else ServeConfig()
        for key, val in (("model", model), ("name", name), ("host", host), ("port", port), ("db", db),
                         ("torch_threads", threads), ("backend", backend),
                         ("precision", precision), ("max_batch", max_batch)):
            if val is not None:
                setattr(cfg, key, val)
        run_server(cfg)


def _keys(app: typer.Typer) -> None:
    keys = typer.Typer(help="API keys per organisation (stored hashed).", no_args_is_help=True)

    @keys.command("create")
    def create(org: str = typer.Option(..., "--org"), name: str = typer.Option("", "--name"),
               admin: bool = typer.Option(False, "--admin", help="the key sees every organisation on /dashboard "
                                          "and may roll back there (on /v1 it acts as ORG)"),
               db: str | None = DB) -> None:
        """Create a key for ORG (creating the organisation) and print it; it is shown only once."""
        print(_store(db).create_key(org, name, admin=admin))

    @keys.command("list")
    def list_(org: str = typer.Option(..., "--org"), db: str | None = DB) -> None:
        """Key ids of ORG (never the keys themselves)."""
        _print(_store(db).list_keys(org))

    @keys.command("revoke")
    def revoke(key_id: str, org: str = typer.Option(..., "--org"), db: str | None = DB) -> None:
        """Revoke a key by its id (the part after `etk_`)."""
        _store(db).revoke_key(org, key_id)
        print(f"revoked {key_id}")

    app.add_typer(keys, name="keys")


def _registry(app: typer.Typer) -> None:
    reg = typer.Typer(help="Checkpoint registry: candidate -> canary -> production -> retired.", no_args_is_help=True)

    @reg.command("add")
    def add(name: str, path: str = typer.Option(..., "--path"), version: int = typer.Option(0, "--version"),
            org: str | None = typer.Option(None, "--org", help="owner (default: shared)"),
            state: str = typer.Option("candidate", "--state"), parent: str | None = typer.Option(None, "--parent"),
            db: str | None = DB) -> None:
        """Register a checkpoint."""
        _print(registry.register_checkpoint(_store(db), name, path, version=version, org=org, parent=parent,
                                            state=state))

    @reg.command("list")
    def list_(org: str | None = typer.Option(None, "--org"), db: str | None = DB) -> None:
        """Checkpoints visible to ORG (shared ones without --org)."""
        _print([c for c in registry.list_checkpoints(_store(db), org)])

    @reg.command("promote")
    def promote(name: str, db: str | None = DB) -> None:
        """Make NAME production (the previous production checkpoint is retired)."""
        _print(registry.promote(_store(db), name))

    @reg.command("set-state")
    def set_state(name: str, state: str, db: str | None = DB) -> None:
        """Move NAME to STATE (candidate, canary, production, retired)."""
        _print(registry.set_state(_store(db), name, state))

    @reg.command("rollback")
    def rollback(name: str | None = typer.Argument(None), org: str | None = typer.Option(None, "--org"),
                 db: str | None = DB) -> None:
        """Retire NAME (default: current production) and restore the production checkpoint it replaced."""
        prod = registry.rollback(_store(db), name, org=org)
        _print({"production": prod})

    app.add_typer(reg, name="registry")


def _experiment(app: typer.Typer) -> None:
    exp = typer.Typer(help="A/B experiments behind model 'auto' (sticky per user).", no_args_is_help=True)

    @exp.command("set")
    def set_(exp_id: str, arm: list[str] = typer.Option(..., "--arm", help="NAME=CHECKPOINT:WEIGHT, control first"),  # noqa: B008
             org: str | None = typer.Option(None, "--org"), db: str | None = DB) -> None:
        """Create or re-weight the active experiment, e.g. --arm control=v1:0.9 --arm canary=v2:0.1."""
        _print(registry.set_experiment(_store(db), exp_id, [_arm(a) for a in arm], org=org))

    @exp.command("stop")
    def stop(exp_id: str, db: str | None = DB) -> None:
        _print(registry.stop_experiment(_store(db), exp_id))

    @exp.command("list")
    def list_(org: str | None = typer.Option(None, "--org"), db: str | None = DB) -> None:
        _print([e for e in registry.list_experiments(_store(db), org)])

    app.add_typer(exp, name="experiment")


def _arm(spec: str) -> tuple[str, str, float]:
    try:
        name, rest = spec.split("=", 1)
        ckpt, weight = rest.rsplit(":", 1)
        return name, ckpt, float(weight)
    except ValueError:
        raise EtudeError(f"bad --arm {spec!r}: use NAME=CHECKPOINT:WEIGHT, e.g. canary=v2:0.1") from None


def register(app: typer.Typer) -> None:
    _serve_command(app)
    _keys(app)
    _registry(app)
    _experiment(app)
