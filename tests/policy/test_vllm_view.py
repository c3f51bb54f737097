"""Regression: `--backend vllm` on a training checkpoint (etude.train.checkpoint: model.safetensors
beside optimizer.safetensors and rng.safetensors) failed to start the engine, which loads every
*.safetensors of a directory ("no module or parameter named '0'"). The engine now gets a view of
the checkpoint without the optimizer's and rng's files; a plain model directory is used as it is."""

from __future__ import annotations

from etude.policy.vllm_backend import _weights_only_view


def test_a_training_checkpoint_is_viewed_without_its_optimizer(tmp_path):
    ck = tmp_path / "step-000005"
    ck.mkdir()
    for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "config.json",
                 "tokenizer.json", "state.json"):
        (ck / name).write_text(name)
    view = _weights_only_view(ck)
    assert view is not None
    from pathlib import Path

    seen = {p.name: p.read_text() for p in Path(view.name).iterdir()}
    assert seen == {n: n for n in ("model.safetensors", "config.json", "tokenizer.json", "state.json")}
    view.cleanup()
    assert (ck / "optimizer.safetensors").is_file()  # nothing of the checkpoint is touched


def test_a_model_directory_is_used_as_it_is(tmp_path):
    (tmp_path / "model.safetensors").write_text("w")
    (tmp_path / "config.json").write_text("{}")
    assert _weights_only_view(tmp_path) is None
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                 "model.safetensors.index.json"):
        (sharded / name).write_text(name)
    assert _weights_only_view(sharded) is None
