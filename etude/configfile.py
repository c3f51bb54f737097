"""The one config loader: every component's dataclass config is read from TOML and overridden
from the command line here, with the same errors everywhere (file, key, expected type).

    cfg = load(TrainConfig, "configs/tiny.toml", "train config", overrides=parse_set(["steps=3"]))
    cfg = load_with(LoopConfig.from_dict, "configs/loop_tiny.toml", "loop config", overrides=...)
    overrides = given_flags(ctx, {"workers": workers, ...})  # flags given on the command line

`build(typ, data)` turns a table into `typ`: unknown keys are an error naming the table and the
known keys (a typo never trains with a default), a nested dataclass field takes a sub-table, a
list becomes a tuple where the field is a tuple, and a scalar of the wrong type is an error
naming the key and the type it expects. Components with extra rules (merging defaults, tables of
tables) do them before or after calling `build`. Not checked: element types inside lists and
dicts (`tuple[str, ...]` accepts any list), and constraints a config's `__post_init__` enforces
itself (it runs, and its EtudeError is prefixed with the file).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from etude.errors import EtudeError

T = TypeVar("T")


SHIPPED = Path(__file__).resolve().parent / "configs"


def shipped(path: str | Path) -> Path:
    """`path` as given when it exists; else, for `configs/NAME` (the configs etude ships, package
    data under etude/configs; the checkout's `configs` links there), the installed package's copy,
    so a command run outside the checkout finds them. Anything else is returned unchanged."""
    p = Path(path)
    if p.exists() or p.is_absolute() or not p.parts or p.parts[0] != "configs":
        return p
    candidate = SHIPPED.joinpath(*p.parts[1:])
    return candidate if candidate.exists() else p


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed file, or an EtudeError "cannot read <what> <path>: <reason>" (missing file,
    permission, invalid TOML) — never a traceback. `configs/...` falls back to the shipped copy."""
    p = shipped(path)
    try:
        return tomllib.loads(p.read_text())
    except OSError as e:
        raise EtudeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise EtudeError(f"cannot read {what} {p}: invalid TOML: {e}") from None


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set` arguments: ["steps=3", "loss.kl_coef=0.1", "model=tiny"] → {"steps": 3, ...};
    values are JSON, else strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise EtudeError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare string
    return out


def given_flags(ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of `values` (option name -> value) whose option was set on the command line,
    not left at its default: what overrides a `--config` file. `ctx` is the command's typer
    (click) context."""
    out = {}
    for name, val in values.items():
        src = ctx.get_parameter_source(name)
        if src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT"):
            out[name] = val
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """`data` with dotted keys ("loss.kl_coef") set on top; a missing table is created."""
    for key, val in (overrides or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise EtudeError(f"--set {key}: {part} is not a table")
        node[last] = val
    return data


def load(typ: type[T], path: str | Path, what: str, *, table: str | None = None,
         overrides: dict[str, Any] | None = None) -> T:
    """`typ` from the TOML file at `path` (its `[table]` if given and present, else the top level)
    with `overrides` (dotted keys from the file's top, "serve.port") applied; every error names
    the file."""
    data = apply_overrides(read_toml(path, what), overrides)
    if table and isinstance(data.get(table), dict):
        data = data[table]
    return build(typ, data, table or "", source=str(path))


def load_with(make: Callable[[dict[str, Any]], T], path: str | Path, what: str, *, table: str | None = None,
              overrides: dict[str, Any] | None = None, must_exist: bool = False) -> T:
    """`make(data)` for a config with its own rules (merged defaults, tables of tables): `data` is
    the TOML file at `path` with `overrides` applied (its `[table]` if given and present); an
    EtudeError from `make` is prefixed with the file. must_exist: a missing file is "no config
    file at PATH" rather than read_toml's "cannot read"."""
    if must_exist and not shipped(path).is_file():
        raise EtudeError(f"no config file at {Path(path)}")
    data = apply_overrides(read_toml(path, what), overrides)
    if table and isinstance(data.get(table), dict):
        data = data[table]
    try:
        return make(data)
    except EtudeError as e:
        raise EtudeError(f"{path}: {e}") from None


def build(typ: type[T], data: Any, where: str, *, source: str | None = None) -> T:
    """`typ(**data)` after checking keys and types (see the module docstring). `where` names the
    table in messages ("" for the file's top level); `source` is the file."""
    pre = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise EtudeError(f"{pre}[{where}] must be a table, not {type(data).__name__}")
    table = f"[{where}]" if where else "the top level"
    fields = {f.name: f for f in dataclasses.fields(typ)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise EtudeError(f"{pre}unknown key(s) in {table}: {', '.join(unknown)} (known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(typ)
    vals = {k: _value(hints.get(k, Any), v, f"{where}.{k}" if where else k, source) for k, v in data.items()}
    try:
        return typ(**vals)
    except EtudeError as e:
        raise EtudeError(f"{pre}{e}" if source else str(e)) from None
    except (TypeError, ValueError) as e:
        raise EtudeError(f"{pre}bad {table}: {e}") from None


def _value(hint: Any, v: Any, key: str, source: str | None) -> Any:
    """`v` converted for a field of type `hint` (nested table, list → tuple), or an EtudeError."""
    arms = _arms(hint)
    if v is None and type(None) in arms:
        return v
    for arm in arms:
        if dataclasses.is_dataclass(arm) and isinstance(v, dict):
            return build(arm, v, key, source=source)  # type: ignore[arg-type]
    if isinstance(v, list) and any(typing.get_origin(a) is tuple or a is tuple for a in arms):
        return tuple(v)
    if any(_matches(a, v) for a in arms):
        return v
    pre = f"{source}: " if source else ""
    raise EtudeError(f"{pre}{key} must be {_name(hint)}, not {type(v).__name__} ({v!r})")


def _arms(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _matches(arm: Any, v: Any) -> bool:
    if arm is Any or isinstance(arm, TypeVar):
        return True
    if arm is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if arm is int:
        return isinstance(v, int) and not isinstance(v, bool)
    origin = typing.get_origin(arm)
    if origin is typing.Literal:
        return v in typing.get_args(arm)
    if origin is not None:
        return isinstance(v, origin)
    if dataclasses.is_dataclass(arm):
        return isinstance(v, arm)  # type: ignore[arg-type]
    return isinstance(v, arm) if isinstance(arm, type) else True


def _name(hint: Any) -> str:
    names = []
    for arm in _arms(hint):
        if arm is type(None):
            names.append("None")
        elif typing.get_origin(arm) is typing.Literal:
            names.append(" | ".join(repr(a) for a in typing.get_args(arm)))
        elif dataclasses.is_dataclass(arm):
            names.append("a table")
        else:
            origin = typing.get_origin(arm) or arm
            names.append({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                          dict: "a table", list: "a list", tuple: "a list"}.get(origin, getattr(origin, "__name__", str(origin))))
    return " or ".join(names)
