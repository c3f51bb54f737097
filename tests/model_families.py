"""Tiny random models of the families people bring (2 layers, hidden 32, built from their
transformers configs), each with SmolLM2's tokenizer (no model hub is reachable here) and a chat
template of the family's shape: `etude model check`'s tests and the path matrix use them."""

from __future__ import annotations

from pathlib import Path

# Templates of our own, in the three shapes families use: ChatML with tools and Hermes <tool_call>
# JSON (the Qwen families), a [TOOL_CALLS] list (Mistral's shape) and Llama 3.x's header turns with
# <|python_tag|>{"name", "parameters"} calls (SmolLM2's tokenizer: its <|im_end|> ends a turn).
HERMES = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRALISH = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}"
    "{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}{% endif %}\n{% endfor %}"
)
LLAMA3ISH = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}<|python_tag|>{% for c in m.tool_calls %}"
    "{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
FAMILIES = {
    "llama": ("LlamaConfig", {}, None),
    "llama3": ("LlamaConfig", {}, LLAMA3ISH),
    "qwen2": ("Qwen2Config", {}, HERMES),
    "qwen3": ("Qwen3Config", {"head_dim": 8}, HERMES),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 16, "decoder_sparse_step": 1}, HERMES),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}, None),
    "mistral": ("MistralConfig", {}, MISTRALISH),
}


def tiny_family(root: Path, family: str, head_dim: int = 8) -> Path:
    """A random model of `family` (2 layers; 4 heads of `head_dim`, 8 by default: hidden 32) with
    SmolLM2's tokenizer and the family's template shape. vLLM's CPU attention needs a head size it
    has a kernel for (64; it refuses 8)."""
    import transformers

    from etude.policy.models import smollm2_tokenizer

    name, extra, template = FAMILIES[family]
    extra = {**extra, "head_dim": head_dim} if "head_dim" in extra else extra
    tok = smollm2_tokenizer()
    cfg = getattr(transformers, name)(vocab_size=len(tok), hidden_size=4 * head_dim, intermediate_size=8 * head_dim,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **extra)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    out = root / (family if head_dim == 8 else f"{family}-h{head_dim}")
    model.save_pretrained(out)
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(out)
    return out
