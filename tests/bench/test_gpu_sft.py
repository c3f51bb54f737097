"""bench/gpu_sft.py: the adapter trained on the GPU machine comes back in shards and merges into the
same base here; an adapter from another base is refused with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.bench import load_bench


def _bench():
    return load_bench("gpu_sft")


def test_train_shards_merge_and_refuse_another_base(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from etude.policy.models import load_model

    bench = _bench()
    monkeypatch.setattr(bench, "SHARD_BYTES", 2_000)  # force several shards, as a 64-rank adapter needs
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 500, size=120).astype(np.uint16)
    mask = np.zeros(120, np.uint8)
    mask[20:40] = mask[80:120] = 1
    np.savez_compressed(tmp_path / "sequences.npz", ids=ids, mask=mask, offsets=np.array([0, 60, 120]))
    ad = tmp_path / "adapter"
    bench.main(["train", "--sequences", str(tmp_path / "sequences.npz"), "--model", "tiny", "--out", str(ad),
                "--work", str(tmp_path / "work"), "--epochs", "2", "--batch", "1", "--r", "4", "--alpha", "8",
                "--warmup", "1", "--lr", "1e-2", "--allow-cpu"])
    meta = json.loads((ad / "train.json").read_text())
    assert meta["steps_done"] == 4
    shards = sorted(ad.glob("adapter-*.safetensors"))
    assert meta["steps"] == 4 and meta["sequences"] == 2 and len(shards) == meta["adapter_shards"] > 1
    assert meta["loss_tokens"] == 2 * (20 + 40)  # two epochs of the masked tokens, no more
    for s in shards:  # each shard within the limit (a lone tensor larger than it gets a shard of its own)
        tensors = load_file(str(s)).values()
        assert sum(v.numel() * 2 for v in tensors) <= 2_000 or len(tensors) == 1

    final = tmp_path / "run" / "final"
    bench.main(["merge", "--adapter", str(ad), "--model", "tiny", "--out", str(final)])
    merged = load_file(str(final / "model.safetensors"))
    base, _ = load_model("tiny")
    sd = base.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not np.allclose(merged[q].float().numpy(), sd[q].float().numpy())  # the adapter is in the weights
    e = "model.embed_tokens.weight"
    assert np.allclose(merged[e].float().numpy(), sd[e].float().numpy())  # LoRA leaves the embeddings alone
    summary = json.loads((final.parent / "summary.json").read_text())
    assert summary["final"] == str(final) and summary["steps"] == 4
    assert len((final.parent / "metrics.jsonl").read_text().splitlines()) == 4

    meta["base_checksum"] = {k: v + 1.0 for k, v in meta["base_checksum"].items()}
    (ad / "train.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit) as e:
        bench.main(["merge", "--adapter", str(ad), "--model", "tiny", "--out", str(tmp_path / "other")])
    assert e.value.code == 2 and "another base" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    with pytest.raises(SystemExit) as e:  # a time budget too small for one step is an error, not an empty adapter
        bench.main(["train", "--sequences", str(tmp_path / "sequences.npz"), "--model", "tiny", "--out",
                    str(tmp_path / "ad2"), "--work", str(tmp_path / "work2"), "--max-train-s", "1e-9", "--allow-cpu"])
    assert e.value.code == 2 and "no time for one step" in capsys.readouterr().err
