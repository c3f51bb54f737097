"""The RL trainer: losses, learner, environments, rollouts (in-process or on Ray), checkpoints.

    from etude.train import TrainConfig, load_config, train
    result = train(load_config("configs/tiny.toml"), out_dir="runs/tiny")

`import etude.train` imports torch (the losses and the config's loss table need it).
"""

from __future__ import annotations

from etude.train.config import EnvConfig, LoraConfig, RayConfig, TrainConfig, load_config
from etude.train.loop import train
from etude.train.losses import LossConfig

__all__ = ["EnvConfig", "LoraConfig", "LossConfig", "RayConfig", "TrainConfig", "load_config", "train"]
