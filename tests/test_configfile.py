"""One config loader (etude.configfile) for every component: the same errors (file, key, expected
type) from train, loop, serve, reward, eval and demo configs, and `--set` overrides applied the
same way.
Regression for issue 16, where four loaders each had their own checks and messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from etude.configfile import apply_overrides, parse_set
from etude.demo.config import load_demo_config
from etude.errors import EtudeError
from etude.evals import EvalConfig
from etude.loop.config import LoopConfig
from etude.rewards.config import RewardConfig
from etude.serve.config import ServeConfig
from etude.train.config import load_config
from etude.train.sft_config import load_sft_config

LOADERS = {
    "train": (lambda p, o=None: load_config(p, o), "", "steps"),
    "train.env.harness": (lambda p, o=None: load_config(p, o), "[env.harness]\n", "env.harness.max_steps"),
    "sft.harness": (lambda p, o=None: load_sft_config(p, o), "[harness]\n", "harness.max_steps"),
    "loop": (lambda p, o=None: LoopConfig.from_toml(p, o), "[train]\n", "train.steps"),
    "serve": (lambda p, o=None: ServeConfig.from_toml(p, o), "[serve]\n", "serve.port"),
    "rewards": (lambda p, o=None: RewardConfig.from_toml(p, overrides=o), "[rewards]\n", "rewards.step_budget"),
    "eval": (lambda p, o=None: EvalConfig.from_toml(p, o), "", "workers"),
    "eval.harness": (lambda p, o=None: EvalConfig.from_toml(p, o), "[harness]\n", "harness.max_steps"),
    "demo": (lambda p, o=None: load_demo_config(p, overrides=o), "", "eval_tasks"),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_loader_names_the_file_the_key_and_the_expected_type(tmp_path: Path, name: str) -> None:
    load, table, key = LOADERS[name]
    field = key.rsplit(".", 1)[-1]
    p = tmp_path / f"{name}.toml"
    p.write_text(f'{table}{field} = "many"\n')
    with pytest.raises(EtudeError) as e:
        load(p)
    assert str(p) in str(e.value) and f"{key} must be an integer, not str ('many')" in str(e.value)
    p.write_text(f"{table}{field}z = 3\n")
    with pytest.raises(EtudeError, match=rf"{p}: unknown key\(s\) in .*{field}z \(known: "):
        load(p)
    with pytest.raises(EtudeError, match=f"(cannot read .*|no config file at ){tmp_path / 'none.toml'}"):  # sft: must_exist
        load(tmp_path / "none.toml")


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_set_overrides_apply_the_same_way_everywhere(tmp_path: Path, name: str) -> None:
    load, table, key = LOADERS[name]
    p = tmp_path / f"{name}.toml"
    p.write_text(table)
    assert load(p, parse_set([f"{key if name != 'train' else 'steps'}=7"])) is not None


def test_nested_tables_lists_and_overrides() -> None:
    assert parse_set(["a.b=3", "m=tiny", 'l=["x"]']) == {"a.b": 3, "m": "tiny", "l": ["x"]}
    assert apply_overrides({"a": {"c": 1}}, {"a.b": 2, "d": 3}) == {"a": {"c": 1, "b": 2}, "d": 3}
    with pytest.raises(EtudeError, match="--set expects key=value"):
        parse_set(["steps"])


def test_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
    """`configs/NAME.toml` given where no such file exists reads the installed package's copy
    (etude/configs), so `etude demo` works outside the checkout; a file that is there wins."""
    from etude.configfile import SHIPPED, read_toml, shipped

    monkeypatch.chdir(tmp_path)
    assert shipped("configs/agent_sft.toml") == SHIPPED / "agent_sft.toml"
    assert "harness" in read_toml("configs/agent_sft.toml", "sft config")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "agent_sft.toml").write_text("mine = 1\n")
    assert read_toml("configs/agent_sft.toml", "sft config") == {"mine": 1}
    assert shipped("configs/no_such.toml").as_posix() == "configs/no_such.toml"
