"""`etude model check`: the table for tiny random models of the families people bring, and one
clear line per problem for broken directories (missing tokenizer, no chat template, unknown
architecture, missing weights, a tool-call format etude does not parse)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from etude.train.modelcheck import OK, PROBLEM, check_model, problems
from tests.model_families import FAMILIES, HERMES, tiny_family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_gets_its_table(tmp_path, family):
    d = tiny_family(tmp_path, family)
    rows = {r.check: r for r in check_model(d, vllm=False)}
    moe = bool(FAMILIES[family][1].get("num_experts") or FAMILIES[family][1].get("num_local_experts"))
    for c in ("config", "model", "weights", "tokenizer", "template"):
        assert rows[c].status == OK, (c, rows[c])
    if moe:  # etude's default targets include the MLP projections, which these MoEs fuse into parameters
        assert rows["lora"].status == PROBLEM and "fused" in rows["lora"].detail and "q_proj" in rows["lora"].detail
    else:
        assert rows["lora"].status == OK, rows["lora"]
    assert rows["tool call"].status == OK, rows["tool call"]
    fmt = {"mistral": "mistral", "llama3": "llama3_json"}.get(family, "hermes")
    assert f"{fmt} " in rows["tool call"].detail  # each family's own format, read back by its parser
    native = "native tools" in rows["template"].detail
    assert native == (FAMILIES[family][2] == HERMES)
    if moe:
        assert rows["moe"].status == OK and "router" in rows["moe"].detail
    else:
        assert "moe" not in rows
    assert "GiB" in rows["memory"].detail


@pytest.mark.parametrize("breakage, says", [
    ("no-tokenizer", "tokenizer: no tokenizer loads"),
    ("no-template", "template: the tokenizer has no chat template"),
    ("unknown-arch", "config: unknown architecture"),
    ("no-weights", "weights: no *.safetensors weights"),
    ("missing-tensor", "weights: 1 parameter(s) missing"),
    ("unparsed-calls", "tool call: the template writes tool calls in a format etude does not parse"),
])
def test_a_broken_directory_is_one_line_per_problem_and_exit_2(tmp_path, breakage, says):
    d = tiny_family(tmp_path, "llama")
    if breakage == "no-tokenizer":
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
            (d / f).unlink(missing_ok=True)
    elif breakage == "no-template":
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "chat_template.jinja").unlink(missing_ok=True)
    elif breakage == "unknown-arch":
        cfg = json.loads((d / "config.json").read_text())
        cfg["model_type"] = "nosuchmodel"
        (d / "config.json").write_text(json.dumps(cfg))
    elif breakage == "unparsed-calls":  # a <function=...> form, as some templates write: none of etude's formats
        (d / "chat_template.jinja").write_text(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
            "<function={{ c.function.name }}>{{ c.function.arguments | tojson }}</function>{% endfor %}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    elif breakage == "no-weights":
        for f in d.glob("*.safetensors"):
            f.unlink()
    else:
        from safetensors.torch import load_file, save_file

        (f,) = d.glob("*.safetensors")
        t = load_file(str(f))
        t.pop(next(k for k in t if "layers.1.mlp.up_proj" in k))
        save_file(t, str(f), metadata={"format": "pt"})
    r = subprocess.run([sys.executable, "-m", "etude.cli", "model", "check", str(d), "--no-vllm"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln.removeprefix("etude: error: ") for ln in r.stderr.splitlines() if ln.strip()]
    assert any(ln.startswith(says) for ln in lines), r.stderr
    assert len(lines) == len(problems(check_model(d, vllm=False)))


def test_a_good_model_exits_0_and_json_lists_every_check(tmp_path):
    d = tiny_family(tmp_path, "qwen3")
    r = subprocess.run([sys.executable, "-m", "etude.cli", "model", "check", str(d), "--no-vllm", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    checks = [row["check"] for row in json.loads(r.stdout)]
    assert checks[:4] == ["config", "model", "weights", "tokenizer"] and "memory" in checks


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python").is_file(),
                    reason="no .venv-vllm (make setup-vllm)")
def test_vllm_registry_is_asked(tmp_path):
    d = tiny_family(tmp_path, "qwen3_moe")
    rows = {r.check: r for r in check_model(d)}
    assert rows["vllm"].status == OK and "Qwen3MoeForCausalLM" in rows["vllm"].detail
    shutil.rmtree(d)
