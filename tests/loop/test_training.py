"""The loop's candidate training is etude's one trainer (`etude.train.loop.train`) on the
`episodes` environment: stored episodes with their behaviour log-probs, replayed. Regression for
issue 16, where etude/loop/training.py re-implemented a training step and its own
samples-to-episode conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etude.envs.families import EpisodesEnv
from etude.errors import EtudeError
from etude.loop.config import TrainSection
from etude.loop.training import train_candidate, train_config
from etude.train.config import TrainConfig
from etude.types import Episode, TurnSample


def _episodes(path: Path, n: int = 4) -> Path:
    eps = [Episode(problem_id=f"i{i}", family="production", reward=float(i % 2), terms={"accept": float(i % 2)},
                   resolved=False, turns=[TurnSample([1, 2, 3 + i], [5 + i, 6, 7], [-1.0, -0.5, -2.0])],
                   policy_version=0) for i in range(n)]
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in eps))
    return path


def test_an_episode_reads_back_equal(tmp_path: Path) -> None:
    ep = Episode(problem_id="x", family="production", reward=0.5, terms={"a": None}, resolved=True,
                 turns=[TurnSample([1], [2, 3], [-0.1, -0.2])], policy_version=3, text="t", meta={"arm": "b"})
    assert Episode.from_dict(json.loads(json.dumps(ep.to_dict()))) == ep


def test_the_episodes_env_replays_what_it_was_given(tmp_path: Path) -> None:
    env = EpisodesEnv(str(_episodes(tmp_path / "e.jsonl")))
    probs = env.problems("train")
    assert len(probs) == 4 and env.problems("test") == []
    out = env.rollout(None, probs[1:3], n=1, max_tokens=8, temperature=1.0, top_p=1.0, seed=0)
    assert [e.problem_id for e in out] == ["i1", "i2"] and out[0].turns[0].logprobs == [-1.0, -0.5, -2.0]
    with pytest.raises(EtudeError, match="group_size must be 1"):
        env.rollout(None, probs, n=2, max_tokens=8, temperature=1.0, top_p=1.0, seed=0)
    with pytest.raises(EtudeError, match="cannot read episodes_file"):
        EpisodesEnv(str(tmp_path / "missing.jsonl"))


def test_one_default_lr() -> None:
    assert TrainSection().lr == TrainConfig().lr
    cfg = train_config("tiny", Path("e.jsonl"), TrainSection(), temperature=0.7, seed=1)
    assert cfg.env.name == "episodes" and cfg.group_size == 1 and cfg.advantage == "baseline"


def test_the_candidate_trains_through_the_trainer_and_resumes(tmp_path: Path) -> None:
    eps = _episodes(tmp_path / "e.jsonl")
    section = TrainSection(steps=2, batch_size=2, lr=1e-3)
    summ = train_candidate(eps, "tiny", tmp_path / "train", section, temperature=1.0, seed=0)
    assert summ["steps"] == 2 and summ["samples"] == 4 and Path(summ["checkpoint"]).is_dir()
    assert [h["step"] for h in summ["history"]] == [1, 2] and all("loss" in h for h in summ["history"])
    again = train_candidate(eps, "tiny", tmp_path / "train", section, temperature=1.0, seed=0)
    assert again["steps"] == 2 and again["checkpoint"] == summ["checkpoint"]  # finished: nothing redone
