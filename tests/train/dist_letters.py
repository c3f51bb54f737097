"""Helper of tests/train/test_distributed.py (not a test module): train the tiny model on the
dense "letters" reward, on however many ranks torchrun gives it (or one process).

    python -m torch.distributed.run --nproc-per-node 2 tests/train/dist_letters.py OUT STEPS
"""

from __future__ import annotations

import json
import sys

from etude.envs.families import ENVS, ArithEnv
from etude.train import TrainConfig, train
from etude.train.config import EnvConfig


class LettersEnv(ArithEnv):
    """Reward = the share of a-z letters in the answer: a random model earns some of it, so
    advantages and gradients are not zero."""

    name = "letters"

    def check(self, problem, text):
        frac = sum("a" <= c <= "z" for c in text) / max(1, len(text))
        return frac, {"letters": frac}, frac > 0.5


def config(steps: int) -> TrainConfig:
    return TrainConfig(model="tiny", steps=steps, prompts_per_step=3, group_size=3, max_new_tokens=8, lr=1e-3,
                       micro_batch_tokens=64, checkpoint_every=1, eval_problems=1, precision="fp32", device="cpu",
                       env=EnvConfig(name="letters", num_train=16, num_test=2))


def main(out: str, steps: int) -> dict:
    ENVS["letters"] = LettersEnv
    return train(config(steps), out, progress=False)


if __name__ == "__main__":
    res = main(sys.argv[1], int(sys.argv[2]))
    if res["rank"] == 0:
        print(json.dumps({"checkpoint": res["checkpoint"], "world_size": res["world_size"]}))
