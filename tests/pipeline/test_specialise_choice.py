"""Stage 5's choice between the SFT and the RL adapter (select slice only) and stage 4's reward
weights reaching its TrainConfig."""

from etude.pipeline.specialise import SpecialiseConfig, pick_adapter, rl_stage_config


def _rl(*evals):
    return {"steps": 16, "checkpoint": "rl/ckpt", "evals": [{"step": s, "right_fix": k, "reward": r}
                                                            for s, k, r in evals]}


def test_more_select_right_fixes_ship_the_rl_adapter_whatever_the_reward():
    chosen, why = pick_adapter("sft/adapter", _rl((0, 0, 0.05), (8, 1, -0.02), (16, 2, -0.01)))
    assert chosen == "rl/ckpt" and "0 -> 2" in why


def test_a_run_that_stopped_editing_ties_on_right_fixes_and_loses_on_reward():
    # the collapse of bench/results/edit_rl.json: 0 right fixes before and after, edits gone
    chosen, why = pick_adapter("sft/adapter", _rl((0, 0, 0.04), (10, 0, 0.0), (20, 0, -0.1)))
    assert chosen == "sft/adapter" and why.startswith("SFT adapter: RL lowered") and "0.040 -> -0.100" in why


def test_a_tie_with_as_high_a_reward_ships_the_rl_adapter_and_fewer_right_fixes_do_not():
    assert pick_adapter("sft/adapter", _rl((0, 1, 0.1), (16, 1, 0.1)))[0] == "rl/ckpt"
    assert pick_adapter("sft/adapter", _rl((0, 2, 0.0), (16, 1, 0.9)))[0] == "sft/adapter"
    assert pick_adapter("sft/adapter", {"steps": 0, "skipped": "no budget"}) == ("sft/adapter",
                                                                                 "SFT adapter (no RL steps)")


def test_stage_4_trains_with_the_configs_tier_weights(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "train.jsonl").write_text("")
    args = dict(lr=5e-5, steps=2, seed=0, every=1)
    cfg = rl_stage_config(SpecialiseConfig.rl_config, tmp_path, "base", "sft/adapter", "hf",
                          weights=dict(SpecialiseConfig.rl_weights), **args)
    assert cfg.env.rewards == {"weights": {"well_formed": -0.1}}
    assert rl_stage_config(SpecialiseConfig.rl_config, tmp_path, "base", "sft/adapter", "hf", **args).env.rewards in ({}, None)
