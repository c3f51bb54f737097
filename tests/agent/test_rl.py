"""Multi-turn agentic RL pieces: flat GRPO groups are skipped and counted, tasks are drawn by
success so far, the reward-up/validation-down alarm, and one real step on repository tasks."""

import random

import pytest

from etude.envs.tasks_env import TasksEnv
from etude.train.config import TrainConfig
from etude.train.loop import flat_groups, reward_up_val_down
from etude.types import Episode, Message, Problem
from tests.agent import TINY_STEP, train_cli


def _ep(r):
    return Episode("p", "tasks", r, {}, r > 0, [], 0)


def test_flat_groups_are_the_all_equal_ones():
    cfg = TrainConfig(group_size=2)
    eps = [_ep(0.0), _ep(0.0), _ep(1.0), _ep(0.0), _ep(-0.5), _ep(-0.5)]
    assert flat_groups(cfg, eps) == {0, 2}
    assert flat_groups(TrainConfig(group_size=2, advantage="baseline"), eps) == set()


def test_alarm_fires_only_when_reward_rises_and_validation_falls():
    recs = [{"kind": "train", "step": 1, "reward": 0.1}, {"kind": "eval", "step": 1, "eval/resolved": 0.5},
            {"kind": "train", "step": 2, "reward": 0.4}]
    assert reward_up_val_down(recs, {"kind": "eval", "step": 2, "eval/resolved": 0.3})
    assert not reward_up_val_down(recs, {"kind": "eval", "step": 2, "eval/resolved": 0.6})
    recs[2]["reward"] = 0.0
    assert not reward_up_val_down(recs, {"kind": "eval", "step": 2, "eval/resolved": 0.3})


def test_choose_prefers_tasks_solved_half_the_time():
    env = TasksEnv(tasks_file="x.jsonl")
    probs = [Problem(f"t{i}", "tasks", (Message("user", "x"),)) for i in range(3)]
    env._stats = {"t0": [10, 10], "t1": [5, 10], "t2": [0, 10]}  # always, half, never
    picks = [env.choose(probs, 1, random.Random(s))[0] for s in range(300)]
    assert picks.count(1) > picks.count(0) and picks.count(1) > picks.count(2)
    two = env.choose(probs, 2, random.Random(0))
    assert len(set(two)) == 2


def test_env_rewards_table_sets_the_weights_and_rejects_bad_ones():
    from etude.errors import EtudeError

    env = TasksEnv(tasks_file="x.jsonl", rewards={"weights": {"patch_similarity": 0.5}})
    assert env.reward_config.weights["patch_similarity"] == 0.5 and env.reward_config.weights["correctness"] == 1.0
    assert TasksEnv(tasks_file="x.jsonl").reward_config.weights["patch_similarity"] == 0.0
    with pytest.raises(EtudeError):
        TasksEnv(tasks_file="x.jsonl", rewards={"wieghts": {}})
    from etude.train.config import EnvConfig

    with pytest.raises(EtudeError, match=r"\[env\.rewards\]: wieghts"):  # in a training config: before a model loads
        TrainConfig(env=EnvConfig(name="tasks", rewards={"wieghts": {}}))


@pytest.mark.slow
def test_one_grpo_step_over_whole_episodes(tmp_path, isodate_tasks, task_cache):
    """`etude train` with the tasks env on real repository tasks: episodes run through the harness
    and sandbox (2 at once), get graded and scored, and the step records the hack monitors and how
    many groups were skipped for having no signal."""
    from etude.tasks import save_tasks

    f = tmp_path / "tasks.jsonl"
    save_tasks(isodate_tasks[:3], f)
    recs = train_cli(tmp_path, TINY_STEP + 'eval_every = 0\n'
                     f'[env]\nname = "tasks"\ntasks_file = "{f}"\nnum_test = 1\nmax_steps = 2\nworkers = 2\n'
                     f'[env.harness]\nmax_observation_chars = 500\n[env.rewards.weights]\npatch_similarity = 0.5\n')
    train = [x for x in recs if x["kind"] == "train"]
    assert len(train) == 1 and train[0]["samples"] == 2
    assert "groups_skipped" in train[0] and "monitor/broken_calls" in train[0] and "monitor/turns" in train[0]
    evals = [x for x in recs if x["kind"] == "eval"]
    assert evals and "alarm/reward_up_val_down" in evals[-1]


def test_an_env_built_directly_refuses_a_misspelt_key_and_make_env_gives_each_its_own():
    """Regression: every env constructor ended in `**_`, so `TasksEnv(tasks_fil=...)` was silently
    the default suite; make_env passed every config field to every env to make that work."""
    from etude.envs.families import ArithEnv, make_env
    from etude.train.config import EnvConfig

    with pytest.raises(TypeError, match="tasks_fil"):
        TasksEnv(tasks_fil="x.jsonl")
    with pytest.raises(TypeError, match="tasks_file"):
        ArithEnv(tasks_file="x.jsonl")
    env = make_env(EnvConfig(name="tasks", tasks_file="x.jsonl", max_operand=7, rewards={"weights": {"patch_similarity": 0.5}}))
    assert env.tasks_file == "x.jsonl" and env.reward_config.weights["patch_similarity"] == 0.5
    assert make_env(EnvConfig(name="arith", num_train=3, tasks_file="ignored.jsonl")).num["train"] == 3


def test_ctrl_c_in_a_rollout_stops_episodes_after_their_turn_and_starts_no_more(monkeypatch):
    import signal
    import threading
    import time

    import etude.envs.tasks_env as te

    started, turns, go = [], [], threading.Event()

    def fake_episode(task, policy, hc, *, on_turn=None):
        started.append(task)
        # NOTE: no clock in the outcome: an episode runs until the rollout stops it (60000 turns of
        # 10 ms bound a broken stop at 10 minutes); it failed under load when the bound was 20 s
        for _ in range(60000):
            if len(started) == 2:  # Ctrl-C once both workers run an episode
                go.set()
            time.sleep(0.01)
            turns.append(task)
            on_turn(None)
        raise AssertionError("an episode ran to its end")

    monkeypatch.setattr(te, "run_episode", fake_episode)
    env = TasksEnv(tasks_file="x.jsonl", workers=2)
    probs = [Problem(f"t{i}", "tasks", (Message("user", "x"),), answer=f"t{i}") for i in range(4)]
    # a real SIGINT, to the main thread as a terminal's Ctrl-C most often lands (os.kill let the
    # kernel hand it to any thread, and in a loaded full-suite run it went unhandled for 20 s)
    main = threading.main_thread().ident
    # a shell's background job (`make test &`) starts with SIGINT ignored, and Python then raises
    # nothing on it: the test installs Python's own handler, as an interactive terminal has it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=lambda: (go.wait(600), signal.pthread_kill(main, signal.SIGINT)), daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            env.rollout(object(), probs, n=2, max_tokens=8, temperature=1.0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 2  # the 6 queued episodes never started
    assert len(turns) < 2 * 60000  # the running ones stopped after a turn, not at their end
