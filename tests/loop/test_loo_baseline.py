"""One sample per request: the leave-one-out baseline (issue 46 item 1). Two users' sessions of the
same task at the same turn are each other's baseline; a request answered once keeps its raw reward
for the trainer's running mean."""

import json

import pytest

from etude.errors import EtudeError
from etude.loop.config import TrainSection
from etude.loop.distill import ScoredSample
from etude.loop.training import episodes_jsonl, loo_rewards, request_key, train_config
from etude.train.loop import to_samples
from etude.train.losses import RunningBaseline
from etude.train.rollout import RolloutBatch
from etude.types import Episode, Generation, Message, RewardBreakdown, Trajectory, Turn


def _sample(i: int, task: str, reward: float, turn: int = 0) -> ScoredSample:
    msgs = [Message("user", task)]
    for _ in range(turn):
        msgs += [Message("assistant", "..."), Message("user", "go on")]
    msgs.append(Message("assistant", f"answer {i}"))
    traj = Trajectory(
        episode_id=f"i{i}",
        task_id=None,
        policy_id="p",
        policy_version=1,
        messages=tuple(msgs),
        turns=(Turn(index=0, generation=Generation(text="")),),
        stop_reason="answer",
    )
    return ScoredSample(
        interaction_id=f"i{i}",
        org_id="acme",
        checkpoint="p",
        policy_version=1,
        prompt_token_ids=(1, 2),
        completion_token_ids=(3,),
        behaviour_logprobs=(-0.5,),
        reward=RewardBreakdown(total=reward, terms={}),
        trajectory=traj,
        user_id=f"u{i}",
    )


def test_leave_one_out_centres_each_answer_on_the_others_of_its_request():
    s = [
        _sample(0, "fix a", 1.0),
        _sample(1, "fix a", 0.0),
        _sample(2, "fix a", 0.5),
        _sample(3, "fix b", 0.7),
        _sample(4, "fix a", 0.2, turn=1),
    ]
    assert request_key(s[0]) == request_key(s[1]) != request_key(s[4])
    adv = loo_rewards(s)
    assert adv[:3] == [1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5]
    assert adv[3] is None and adv[4] is None  # answered once: the trainer's running mean decides
    eps = [json.loads(x) for x in episodes_jsonl(s, "loo").splitlines()]
    assert [e["family"] for e in eps] == ["production-loo"] * 3 + ["production"] * 2
    assert eps[0]["reward"] == 0.75 and eps[0]["meta"]["raw_reward"] == 1.0 and eps[3]["reward"] == 0.7
    assert [json.loads(x)["reward"] for x in episodes_jsonl(s).splitlines()] == [1.0, 0.0, 0.5, 0.7, 0.2]


def test_negative_weight_scales_only_the_answers_worse_than_their_request():
    s = [_sample(0, "fix a", 1.0), _sample(1, "fix a", 0.0), _sample(2, "fix b", 0.3)]
    eps = [json.loads(x) for x in episodes_jsonl(s, "loo", negative_weight=0.0).splitlines()]
    assert [e["reward"] for e in eps] == [1.0, 0.0, 0.3]  # the worse answer keeps no gradient; a single stays raw
    assert eps[1]["meta"]["loo_advantage"] == -1.0 and eps[1]["meta"]["raw_reward"] == 0.0
    half = [json.loads(x)["reward"] for x in episodes_jsonl(s, "loo", negative_weight=0.5).splitlines()]
    assert half[:2] == [1.0, -0.5]


def test_negative_weight_outside_zero_one_is_refused():
    with pytest.raises(EtudeError, match="negative_weight"):
        TrainSection(negative_weight=1.5)


def test_the_trainer_takes_a_leave_one_out_advantage_as_it_is_and_centres_the_rest(tmp_path):
    s = [_sample(0, "fix a", 1.0), _sample(1, "fix a", 0.0), _sample(2, "fix b", 0.3), _sample(3, "fix c", 0.1)]
    eps = [Episode.from_dict(json.loads(x)) for x in episodes_jsonl(s, "loo").splitlines()]
    cfg = train_config("m", tmp_path / "e.jsonl", TrainSection(), temperature=1.0, seed=0)
    baseline = RunningBaseline()
    adv = [x.advantage for x in to_samples(cfg, RolloutBatch(0, 1, eps, 0.0), baseline)]
    # the two answers to "fix a" keep +-1 (the running mean would have zeroed the first of them);
    # the singles go through the running mean: the first has no baseline yet, the second is 0.1 - 0.3
    assert adv == pytest.approx([1.0, -1.0, 0.0, -0.2])
    assert set(baseline.means) == {"production"}
