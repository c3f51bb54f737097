"""The RL trainer: losses, learner, environments, rollouts (in-process or on Ray), checkpoints.

    from etude.train import TrainConfig, load_config, train
    result = train(load_config("configs/tiny.toml"), out_dir="runs/tiny")

`train` is imported lazily so `import etude.train` does not import torch.
"""

from __future__ import annotations

from typing import Any

from etude.train.config import EnvConfig, LoraConfig, RayConfig, TrainConfig, load_config
from etude.train.losses import LossConfig


def train(cfg: TrainConfig, out_dir: Any, **kw: Any) -> Any:
    """Run (or resume) training into `out_dir`; see etude.train.loop.train."""
    from etude.train.loop import train as _train

    return _train(cfg, out_dir, **kw)


__all__ = ["EnvConfig", "LoraConfig", "LossConfig", "RayConfig", "TrainConfig", "load_config", "train"]
