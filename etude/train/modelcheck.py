"""`etude model check PATH`: what works for a user's model directory, before GPU hours are spent.

Each check reads the directory and answers one question; nothing here loads the weights into
memory (the architecture is built on the meta device, the safetensors files are read for their
headers only), so a 70B directory is checked as fast as a tiny one.

1. config     — transformers reads config.json and knows its `model_type`;
2. model      — the architecture builds (on the meta device): parameters, and experts for a MoE;
3. weights    — every parameter the architecture expects is in the safetensors files (a tied
                `lm_head` may be absent), with the right shape;
4. tokenizer  — it loads;
5. template   — a chat template exists and renders the harness's opening (system, user) with
                etude's tools; whether it renders the tools itself (native) or etude must put them
                in the system prompt, as it does for SmolLM2;
6. tool call  — a call rendered as the template writes an assistant's tool call (or, where the
                template writes none, as etude's `<tool_call>` text) parses back through
                etude.toolcalls to the same name and arguments: what training and production read;
7. lora       — the LoRA target modules (etude's default: the attention and MLP projections) are
                linear layers of this architecture;
8. vllm       — vLLM's model registry lists the architecture (where vLLM is installed: this
                environment, else `--vllm-python`, default the checkout's .venv-vllm);
9. moe        — for a mixture of experts: etude.scale.moe finds its routers, so sampled routes
                can be replayed in training;
10. memory    — an estimate per GPU for LoRA SFT, full fine-tuning and GRPO at `--seq-len` and
                `--gpus` (formulas in `memory_estimate`).

What it does not guarantee: that training converges or that vLLM's kernels exist for this dtype on
this machine; the memory figures are estimates (stated formulas), not measurements.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.harness.prompt import build_messages
from etude.policy.local import decode_reply, render_messages
from etude.scale.moe import moe_blocks
from etude.toolcalls import TEXT_FORMATS, parse_output, render_calls, text_format_of
from etude.tools import tool_schemas
from etude.train.config import LoraConfig
from etude.types import ToolCall

OK, PROBLEM, SKIPPED, INFO = "ok", "problem", "skipped", "info"
PROBE_CALL = {"name": "read_file", "arguments": {"path": "src/app.py"}}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # ok | problem | skipped | info
    detail: str


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _experts(cfg: Any) -> int:
    for k in EXPERT_KEYS:
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v > 1:
            return v
    return 0


def _meta_model(cfg: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def check_weights(path: Path) -> list[str]:
    """Problems between the architecture's parameters and the directory's safetensors files (empty:
    none), as transformers loads them (its checkpoint conversions included, e.g. per-expert tensors
    fused into one) onto the meta device: nothing is materialised."""
    from transformers import AutoModelForCausalLM
    _, info = AutoModelForCausalLM.from_pretrained(str(path), device_map="meta", output_loading_info=True)
    missing = sorted(info.get("missing_keys") or ())
    wrong = sorted(info.get("mismatched_keys") or (), key=str)
    out = []
    if missing:
        out.append(f"{len(missing)} parameter(s) missing from the safetensors files, e.g. {', '.join(missing[:3])}")
    if wrong:
        k = wrong[0]
        out.append(f"{len(wrong)} tensor(s) of the wrong shape, e.g. {k[0] if isinstance(k, tuple) else k}")
    return out


def _messages_for_template() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    schemas = tool_schemas()
    msgs = build_messages("Fix the failing test in tests/test_app.py.", schemas, native_tools=True)
    return render_messages(msgs), list(schemas)


def check_template(tok: Any) -> tuple[list[Row], bool]:
    """(rows, whether the template renders tools natively)."""
    if not getattr(tok, "chat_template", None):
        return [Row("template", PROBLEM, "the tokenizer has no chat template (tokenizer_config.json chat_template)")], False
    msgs, tools = _messages_for_template()
    try:
        text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # a template that raises on tools is a finding, not a crash
        return [Row("template", PROBLEM, f"the chat template does not render the harness's opening: {_first_line(e)}")], False
    native = all(t["function"]["name"] in text for t in tools)
    how = ("renders etude's tools itself (native tools)" if native else
           "ignores the tools; etude puts them in the system prompt (as for SmolLM2)")
    return [Row("template", OK, f"renders the harness's opening ({len(text)} characters); it {how}")], native


def check_tool_call(tok: Any) -> Row:
    """A call as this template writes an assistant's tool call, parsed back (see the module doc)."""
    msgs, _ = _messages_for_template()
    call = {"type": "function", "function": {"name": PROBE_CALL["name"], "arguments": PROBE_CALL["arguments"]}}
    native = ""
    try:
        after = tok.apply_chat_template([*msgs, {"role": "assistant", "content": "", "tool_calls": [call]}],
                                        tokenize=False)
        for gen_prompt in (True, False):  # the reply alone, as a model samples it after the assistant header
            before = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen_prompt)
            if after.startswith(before):
                native = after[len(before):]
                break
    except Exception:  # noqa: BLE001 - a template without tool calls falls back to the text format below
        pass
    fmt = text_format_of(tok)
    if native and PROBE_CALL["name"] in native:
        res = parse_output(decode_reply(tok, tok(native, add_special_tokens=False)["input_ids"]), fmt)
        got = [(c.name, c.arguments) for c in res.tool_calls]
        if got == [(PROBE_CALL["name"], PROBE_CALL["arguments"])]:
            return Row("tool call", OK, f"the template writes tool calls in the {fmt} format; etude's {fmt} parser "
                                        "reads them back (harness, server and SFT use it: tool_format auto)")
        snippet = " ".join(native.split())[:80]
        return Row("tool call", PROBLEM, f"the template writes tool calls in a format etude does not parse ({snippet!r}); "
                                         f"etude reads {', '.join(TEXT_FORMATS)}: SFT must teach one of them")
    probe = ToolCall(id="probe", name=PROBE_CALL["name"], arguments=PROBE_CALL["arguments"])
    text = render_calls([probe], fmt)
    res = parse_output(text, fmt)
    ok = [(c.name, c.arguments) for c in res.tool_calls] == [(PROBE_CALL["name"], PROBE_CALL["arguments"])]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    back = tok.decode(ids)
    if ok and back == text:
        return Row("tool call", OK, f"the template writes no tool calls; etude's {fmt} text round-trips through "
                                    f"the tokenizer ({len(ids)} tokens) and the parser")
    return Row("tool call", PROBLEM, f"etude's {fmt} call text does not survive the tokenizer's round trip")


def check_lora(model: Any, targets: Sequence[str], moe: bool = False) -> Row:
    import torch

    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [t for t in targets if t not in linear]
    if missing:
        why = (" (this mixture of experts keeps its experts' weights fused in parameters, not linear layers: an "
               "adapter on them would be silently absent)") if moe else ""
        return Row("lora", PROBLEM, f"target module(s) {', '.join(missing)} are not linear layers here{why}; set "
                                    f"[lora] target_modules to some of {', '.join(sorted(linear - {'lm_head'}))}")
    return Row("lora", OK, f"targets {', '.join(targets)} are linear layers")


def vllm_archs(vllm_python: str | None) -> tuple[list[str] | None, str]:
    """(architectures vLLM's registry lists, where from); None where vLLM is nowhere to ask."""
    import importlib.util

    code = "import json; from vllm import ModelRegistry; print(json.dumps(sorted(ModelRegistry.get_supported_archs())))"
    if importlib.util.find_spec("vllm") is not None:
        from vllm import ModelRegistry

        return sorted(ModelRegistry.get_supported_archs()), "this environment's vllm"
    exe = Path(vllm_python) if vllm_python else Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if not exe.is_file():
        return None, f"no vLLM here ({exe} does not exist; `make setup-vllm`)"
    p = subprocess.run([str(exe), "-c", code], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return None, f"{exe} could not list vLLM's architectures ({(p.stderr.strip().splitlines() or ['?'])[-1][:120]})"
    return json.loads(p.stdout.strip().splitlines()[-1]), f"{exe}"


def memory_estimate(params: int, cfg: Any, seq_len: int, gpus: int, lora_params: int) -> dict[str, float]:
    """GiB per GPU (estimates; 1 GiB = 2**30 bytes). Weights bf16 (2 bytes a parameter) are
    replicated for LoRA and sharded by FSDP for full fine-tuning (16 bytes a parameter: bf16
    weights and gradients, fp32 master weights and two AdamW moments). Activations of one sequence
    with checkpointing per layer: 2 bytes × seq_len × hidden × (layers + 12 for the recomputed
    layer) plus fp32 logits for the last chunk of 1024 tokens × vocabulary. GRPO adds a vLLM
    copy of the weights (bf16) and a KV cache for 16 sequences of seq_len."""
    gib = 2.0**30
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(cfg, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(cfg, "head_dim", 0) or (hidden // heads if heads else 0))
    act = 2 * seq_len * hidden * (layers + 12) + 4 * min(seq_len, 1024) * vocab
    lora = 2 * params + 16 * lora_params + act
    full = 16 * params / gpus + act
    kv = 2 * 2 * layers * kv_heads * head_dim * seq_len * 16
    grpo = lora + 2 * params + kv / gpus
    return {"sft_lora": lora / gib, "sft_full": full / gib, "grpo_lora": grpo / gib}


def check_model(path: str | Path, *, seq_len: int = 4096, gpus: int = 1, targets: Sequence[str] | None = None,
                vllm_python: str | None = None, vllm: bool = True) -> list[Row]:
    """Every check of the module doc, in order; a check whose inputs failed is skipped."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the findings are the rows: the command's stderr holds its problems, one per line
    hf_logging.disable_progress_bar()
    p = Path(path)
    if not p.is_dir():
        raise EtudeError(f"{path}: not a model directory")
    rows: list[Row] = []
    targets = tuple(targets or LoraConfig().target_modules)
    try:
        cfg = AutoConfig.from_pretrained(str(p))
        arch = (getattr(cfg, "architectures", None) or ["?"])[0]
        rows.append(Row("config", OK, f"{cfg.model_type} ({arch})"))
    except Exception as e:  # noqa: BLE001 - each failure is a row, never a traceback
        why = _first_line(e)
        if "model_type" in why or "Unrecognized" in why or "does not recognize" in why:
            why = f"unknown architecture: {why}"
        rows.append(Row("config", PROBLEM, why))
        return rows + [Row(c, SKIPPED, "needs the config") for c in ("model", "weights", "lora", "vllm", "moe", "memory")] \
            + _tokenizer_rows(p, AutoTokenizer)
    model = None
    try:
        model = _meta_model(cfg)
        params = sum(t.numel() for t in model.parameters())
        experts = _experts(cfg)
        rows.append(Row("model", OK, f"{params / 1e6:.1f}M parameters" + (f", {experts} experts" if experts else "")))
    except Exception as e:  # noqa: BLE001
        rows.append(Row("model", PROBLEM, f"the architecture does not build: {_first_line(e)}"))
    if model is not None:
        try:
            files = sorted(p.glob("*.safetensors"))
            if not files:
                rows.append(Row("weights", PROBLEM, "no *.safetensors weights in the directory"))
            else:
                probs = check_weights(p)
                rows.append(Row("weights", PROBLEM, "; ".join(probs)) if probs else
                            Row("weights", OK, f"{len(files)} safetensors file(s) hold every parameter"))
        except Exception as e:  # noqa: BLE001
            rows.append(Row("weights", PROBLEM, f"cannot read the safetensors files: {_first_line(e)}"))
    rows += _tokenizer_rows(p, AutoTokenizer)
    if model is not None:
        rows.append(check_lora(model, targets, moe=bool(_experts(cfg))))
    if vllm:
        archs, where = vllm_archs(vllm_python)
        if archs is None:
            rows.append(Row("vllm", SKIPPED, where))
        elif arch in archs:
            rows.append(Row("vllm", OK, f"{arch} is in vLLM's registry ({where})"))
        else:
            rows.append(Row("vllm", PROBLEM, f"{arch} is not in vLLM's registry ({where}): no vLLM rollouts or serving; "
                                             "use --backend hf"))
    if model is not None and _experts(cfg):
        blocks = moe_blocks(model)
        rows.append(Row("moe", OK, f"routing replay finds {len(blocks)} router(s)") if blocks else
                    Row("moe", PROBLEM, "a mixture of experts whose routers etude.scale.moe does not find: sampled routes "
                                        "cannot be replayed in training (trained as dense)"))
    if model is not None:
        lora_params = sum(_lora_size(m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets)
        est = memory_estimate(params, cfg, seq_len, gpus, lora_params)
        rows.append(Row("memory", INFO, f"per GPU at seq {seq_len}, {gpus} GPU(s): LoRA SFT {est['sft_lora']:.1f} GiB, "
                                        f"full SFT (FSDP) {est['sft_full']:.1f} GiB, GRPO with LoRA + vLLM "
                                        f"{est['grpo_lora']:.1f} GiB (estimates: etude.train.modelcheck.memory_estimate)"))
    return rows


def _lora_size(module: Any, r: int = 16) -> int:
    return r * (int(getattr(module, "in_features", 0)) + int(getattr(module, "out_features", 0)))


def _tokenizer_rows(p: Path, auto_tokenizer: Any) -> list[Row]:
    try:
        tok = auto_tokenizer.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001
        return [Row("tokenizer", PROBLEM, f"no tokenizer loads: {_first_line(e)}"),
                Row("template", SKIPPED, "needs the tokenizer"), Row("tool call", SKIPPED, "needs the tokenizer")]
    rows = [Row("tokenizer", OK, f"{type(tok).__name__}, {len(tok)} tokens")]
    trows, _native = check_template(tok)
    rows += trows
    rows.append(check_tool_call(tok) if trows[0].status == OK else Row("tool call", SKIPPED, "needs a working template"))
    return rows


def problems(rows: Sequence[Row]) -> list[str]:
    return [f"{r.check}: {r.detail}" for r in rows if r.status == PROBLEM]


def to_json(rows: Sequence[Row]) -> list[dict[str, str]]:
    return [asdict(r) for r in rows]
