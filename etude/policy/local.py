"""A local policy: any Hugging Face causal LM through transformers, on CPU or GPU.

`LocalPolicy` implements `protocols.Policy`. Every `Generation` it returns carries the prompt
token ids it conditioned on, the sampled token ids and, per sampled token, the log-probability
under the distribution actually sampled from (logits / temperature, then top-p truncation and
renormalisation). The trainer uses those as behaviour log-probs for importance correction.

Guarantees:
- batched sampling (`generate_batch`) with left padding and the KV cache (transformers'
  `generate`), `n` samples per prompt, returned flat and prompt-major;
- the end-of-turn token (`<|im_end|>` for SmolLM2) is included in `token_ids` / `logprobs`
  when the model emitted it (so training teaches the model to stop); `text` omits it;
- no hidden sampling knobs: top-k and repetition penalties of the model's generation config
  are switched off, so the behaviour distribution is exactly temperature + top-p;
- `load_weights` swaps weights under a lock between generations and bumps `version`.
- MoE models (etude.scale.moe): router choices are recorded during sampling and returned as
  `RoutedGeneration.routes`, so the learner can replay them (dense models: plain Generation).

Not guaranteed: bit-identical log-probs to a fresh full forward pass (KV cache and padding
change float rounding by ~1e-5); determinism across devices. `temperature == 0` is greedy and
reports the log-prob of the chosen token under the untempered model.

`native_tools = False`: the harness renders tools into the system prompt and parses the text
format the chat template writes (`etude.toolcalls.text_format_of`: `<tool_call>` for SmolLM2,
`[TOOL_CALLS]` for a Mistral template, `{"name", "parameters"}` for Llama 3.x), so `tools` passed
here are ignored by design (rendering them again would duplicate them). Assistant messages with
structured `tool_calls` whose text lacks them are rendered back in that format so the model sees
its own calls.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.protocols import BatchPolicy, ModelPolicy, NativeToolsPolicy, TokenizerPolicy, TokenPolicy
from etude.toolcalls import CALL_TAG, render_calls, text_format_of, writes_calls
from etude.types import Generation, Message

from .models import load_model
from .prefix import MIN_REUSE, PrefixCache, batch_cache, row_layers


@functools.cache
def _cache_kw() -> str:
    """The KV cache's name in `generate`/`forward` keywords and generate's output: "cache" in
    transformers 5.24 (etude's pin), "past_key_values" in 5.19 (the vLLM environment's pin),
    where a `cache=` keyword is silently ignored."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


__all__ = ["ChatTemplatePolicy", "LocalPolicy", "completion_ids", "decode_reply", "encode_conversation", "load_model",
           "render_messages"]


def render_messages(messages: Sequence[Message], fmt: str = "hermes") -> list[dict[str, str]]:
    """Messages → the plain dicts a chat template expects. An assistant message with structured
    `tool_calls` that its text does not already write gets them in text format `fmt`."""
    out = []
    for m in messages:
        content = m.content
        if m.role == "assistant" and m.tool_calls and not writes_calls(content, fmt):
            if fmt == "hermes":  # the compact form SmolLM2 was trained on (render_calls' has newlines)
                calls = "".join(
                    "<tool_call>" + json.dumps({"name": c.name, "arguments": c.arguments}) + "</tool_call>"
                    for c in m.tool_calls
                )
            else:
                calls = render_calls(m.tool_calls, fmt)
            content = (content + "\n" + calls) if content else calls
        out.append({"role": m.role, "content": content})
    return out


def encode_conversation(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the assistant header: the one
    renderer behind sampling (`LocalPolicy.encode_prompt`), serving and SFT (`etude.train.sft`)."""
    if not messages:
        raise EtudeError("cannot generate from an empty conversation")
    ids = tokenizer.apply_chat_template(
        render_messages(messages, text_format_of(tokenizer)), add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )
    if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
        ids = ids["input_ids"]
    return list(ids)


def decode_reply(tokenizer: Any, ids: Sequence[int]) -> str:
    """A sampled reply's text: special tokens skipped, except the tag its text tool format needs
    (`[TOOL_CALLS]` and `<|python_tag|>` are special tokens in Mistral's and Llama 3's tokenizers;
    skipping them would turn a call into bare text). For `<tool_call>` models this is
    `decode(ids, skip_special_tokens=True)`."""
    fmt = text_format_of(tokenizer)
    if fmt == "hermes":
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    keep = tokenizer.convert_tokens_to_ids(CALL_TAG[fmt])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    drop = {i for i, t in added.items() if getattr(t, "special", False)} | set(tokenizer.all_special_ids)
    drop.discard(keep)
    return tokenizer.decode([i for i in ids if i not in drop], skip_special_tokens=False)


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The chat template's end-of-turn token (`<|im_end|>`), else the tokenizer's EOS."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end, int) or end == tokenizer.unk_token_id:
        return tokenizer.eos_token_id
    return end


def stop_ids(tokenizer: Any) -> list[int]:
    """Tokens that end a sampled turn: EOS and the end-of-turn token (LocalPolicy and VLLMPolicy)."""
    return sorted(i for i in {tokenizer.eos_token_id, end_of_turn_id(tokenizer)} if i is not None)


def completion_ids(tokenizer: Any, message: Message) -> list[int]:
    """The ids a model samples for assistant `message`: its rendered content, then end-of-turn."""
    content = render_messages([message], text_format_of(tokenizer))[0]["content"]
    return list(tokenizer(content, add_special_tokens=False)["input_ids"]) + [int(end_of_turn_id(tokenizer))]


class ChatTemplatePolicy(TokenPolicy, BatchPolicy, TokenizerPolicy):
    """What LocalPolicy and VLLMPolicy share above token ids, written once: the chat template
    renders a conversation to prompt ids (`encode_prompt`, through `encode_conversation`), the
    tokenizer's EOS and end-of-turn token stop a completion, and `generate_batch` / `generate`
    sample through the subclass's own `generate_ids`. `tools` are ignored by design (the harness
    renders them into the system prompt for these text-format models: `native_tools = False`)."""

    tokenizer: Any

    @property
    def stop_token_ids(self) -> list[int]:
        return stop_ids(self.tokenizer)

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the chat-templated conversation, ending with the assistant header."""
        return encode_conversation(self.tokenizer, messages)

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (), *, max_tokens: int = 512,
                 temperature: float = 0.7, top_p: float | None = None, seed: int | None = None) -> Generation:
        return self.generate_batch([messages], tools, n=1, max_tokens=max_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed)[0]

    def generate_batch(self, conversations: Sequence[Sequence[Message]], tools: Sequence[dict[str, Any]] = (), *,
                       n: int = 1, max_tokens: int = 512, temperature: float = 0.7, top_p: float | None = None,
                       seed: int | None = None) -> list[Generation]:
        """`n` samples for each conversation, flat and prompt-major: [c0s0, c0s1, …, c1s0, …]."""
        return self.generate_ids([self.encode_prompt(m) for m in conversations], n=n, max_tokens=max_tokens,
                                 temperature=temperature, top_p=top_p, seed=seed)


class LocalPolicy(ChatTemplatePolicy, NativeToolsPolicy, ModelPolicy):
    """A transformers causal LM behind `protocols.Policy`, with batched sampling and log-probs."""

    native_tools = False

    def __init__(self, model: Any, tokenizer: Any, *, id: str = "local", version: int = 0, top_p: float = 1.0,
                 prefix_cache_tokens: int = 65536):
        self.model = model
        self.tokenizer = tokenizer
        self.id = id
        self.version = version
        self.top_p = top_p  # default nucleus mass for every call; 1.0 = plain tempered softmax
        self._lock = threading.Lock()
        # Turn k+1 of a conversation reuses turn k's KV (etude.policy.prefix); 0 switches it off.
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"

    @classmethod
    def from_pretrained(cls, name: str = "smollm2", *, id: str | None = None, device: str | None = None,
                        dtype: Any = None, top_p: float = 1.0) -> LocalPolicy:
        """`"smollm2"` (default), `"tiny"` (random, for tests) or a model directory."""
        model, tok = load_model(name, dtype=dtype)
        if device:
            model.to(device)
        return cls(model, tok, id=id or Path(name).name, top_p=top_p)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    # --- sampling (encode_prompt, generate and generate_batch: ChatTemplatePolicy) ------------

    def generate_ids(self, prompts: Sequence[Sequence[int]], *, n: int = 1, max_tokens: int = 512,
                     temperature: float = 0.7, top_p: float | None = None, seed: int | None = None) -> list[Generation]:
        """Sample from token-id prompts (what `generate_batch` and the trainer call)."""
        if n < 1 or max_tokens < 1:
            raise EtudeError("n and max_tokens must be at least 1")
        top_p = self.top_p if top_p is None else top_p
        limit = self.context_length()
        fits = [i for i, p in enumerate(prompts) if len(p) < limit]
        out: list[Generation] = [self._overflow(list(p)) for p in prompts for _ in range(n)]  # replaced where it fits
        if fits:
            max_new = max(1, min(max_tokens, limit - max(len(prompts[i]) for i in fits)))
            t0 = time.perf_counter()
            with self._lock:
                rows = self._sample([list(prompts[i]) for i in fits], n, max_new, temperature, top_p, seed)
            latency = time.perf_counter() - t0
            for j, (ids, lps, finish, routes) in enumerate(rows):
                i = fits[j // n]
                out[i * n + j % n] = self._generation(list(prompts[i]), ids, lps, finish, latency, routes)
        return out

    def _overflow(self, prompt: list[int]) -> Generation:
        # The conversation no longer fits the context window: I answer nothing rather than cut
        # the prompt (which would silently drop the system prompt and the tools).
        return Generation(text="", prompt_token_ids=tuple(prompt), finish_reason="length",
                          policy_id=self.id, policy_version=self.version)

    def _generation(self, prompt: list[int], ids: list[int], lps: list[float], finish: str,
                    latency: float, routes: Any = None) -> Generation:
        text = decode_reply(self.tokenizer, ids)
        kw: dict[str, Any] = dict(text=text, prompt_token_ids=tuple(prompt), token_ids=tuple(ids),
                                  logprobs=tuple(lps), finish_reason=finish, policy_id=self.id,
                                  policy_version=self.version, latency_s=latency)
        if routes is not None:  # an MoE model: the routes go to the learner for replay
            # NOTE: lazy on purpose (here and in _sample): etude.scale.moe imports torch, and this
            # module is imported by serve.pool and policy without torch until a model is loaded.
            from etude.scale.moe import RoutedGeneration

            return RoutedGeneration(**kw, routes=routes)
        return Generation(**kw)

    def _sample(self, prompts: list[list[int]], n: int, max_new: int, temperature: float, top_p: float,
                seed: int | None) -> list[tuple[list[int], list[float], str, Any]]:
        """`n` samples of each prompt, prompt-major. With n > 1 each prompt is prefilled once and
        its KV cache repeated n times (what a GRPO group costs: one prefill, not n)."""
        import torch
        from transformers import GenerationConfig

        from etude.scale.moe import is_moe, record_routing, routes_for_rows

        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, width - len(p):] = torch.tensor(p)
            attn[r, width - len(p):] = 1
        moe = is_moe(self.model)  # MoE: record router choices for replay in training (etude.scale.moe)
        cache = None
        reuse = self.prefix_cache is not None and n == 1 and not moe
        if reuse:
            cache = self._reuse(prompts, width)
        if n > 1 and width > 1 and not moe:
            cache = self._prefill(input_ids[:, :-1], attn[:, :-1])
            cache.batch_repeat_interleave(n)
        if n > 1:
            input_ids, attn = input_ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
            prompts = [p for p in prompts for _ in range(n)]
        greedy = temperature <= 0
        gc = GenerationConfig(
            max_new_tokens=max_new, do_sample=not greedy, temperature=None if greedy else temperature,
            top_p=None if greedy or top_p >= 1 else top_p, top_k=None if greedy else 0, repetition_penalty=None,
            eos_token_id=self.stop_token_ids, pad_token_id=pad, output_scores=True,
            return_dict_in_generate=True, use_cache=True,
        )
        # A seed samples from its own stream and leaves the global RNG as it was; without one the
        # global RNG is used and advanced, so two unseeded calls draw different samples.
        rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
        with torch.inference_mode(), rng, (record_routing(self.model) if moe else contextlib.nullcontext()) as rec:
            if seed is not None:
                torch.manual_seed(seed)
            res = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attn.to(self.device),
                                      generation_config=gc, **({_cache_kw(): cache} if cache else {}))
        new = res.sequences[:, width:]
        # scores[t] are the processed logits (after temperature / top-p) the token at t was drawn
        # from. I reduce them step by step: stacking [batch, steps, vocab] would cost gigabytes.
        chosen = torch.stack([torch.log_softmax(sc.float(), dim=-1).gather(-1, new[:, t, None]).squeeze(-1)
                              for t, sc in enumerate(res.scores)], dim=1).cpu()
        rows = [self._cut(new[r].cpu(), chosen[r]) for r in range(len(prompts))]
        out_cache = getattr(res, _cache_kw(), None)
        if reuse and out_cache is not None:
            fed = len(res.scores) - 1  # the last sampled token was never fed back
            for r, (ids, _, _) in enumerate(rows):
                m = min(len(ids), fed)
                self.prefix_cache.put(prompts[r] + ids[:m], self.version,
                                      row_layers(out_cache, r, width - len(prompts[r]), width + m))
        routes = routes_for_rows(rec, width, [len(p) for p in prompts], [len(r[0]) for r in rows]) if moe else None
        return [(*row, routes[r] if routes else None) for r, row in enumerate(rows)]

    def _reuse(self, prompts: list[list[int]], width: int) -> Any:
        """A cache of what earlier calls already computed for these prompts, or None."""
        pc = self.prefix_cache
        rows = [pc.lookup(p, self.version) for p in prompts]
        cache, cached = None, 0
        if any(k >= MIN_REUSE for _, k in rows):
            cache, cached = batch_cache(self.model.config, rows, [len(p) for p in prompts], width)
        pc.hits += cache is not None
        pc.reused_tokens += sum(max(0, len(p) - (width - cached)) for p in prompts) if cache is not None else 0
        pc.fed_tokens += len(prompts) * (width - cached) if cache is not None else sum(map(len, prompts))
        return cache

    def _prefill(self, input_ids: Any, attn: Any) -> Any:
        """The KV cache of left-padded prompts (all but their last token, which `generate` feeds)."""
        import torch
        from transformers import DynamicCache

        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            self.model(input_ids=input_ids.to(self.device), attention_mask=attn.to(self.device),
                       position_ids=pos.to(self.device), use_cache=True, logits_to_keep=1, **{_cache_kw(): cache})
        return cache

    def _cut(self, ids: Any, lps: Any) -> tuple[list[int], list[float], str]:
        stops = set(self.stop_token_ids)
        toks = ids.tolist()
        for t, tok in enumerate(toks):
            if tok in stops:
                return toks[: t + 1], lps[: t + 1].tolist(), "stop"
        return toks, lps.tolist(), "length"

    # --- weights --------------------------------------------------------------------------

    def load_weights(self, weights: Mapping[str, Any] | str | Path, *, version: int | None = None) -> int:
        """Replace the weights (a state dict, a safetensors file or a directory holding
        `model.safetensors`) and bump `version` (or set it). Returns the new version."""
        state = _read_state(weights) if isinstance(weights, (str, Path)) else dict(weights)
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            if unexpected or set(missing) - tied:
                raise EtudeError(f"weights do not fit the model: missing={sorted(missing)[:3]} "
                                 f"unexpected={sorted(unexpected)[:3]}")
            self.version = self.version + 1 if version is None else int(version)
        return self.version


def _read_state(path: str | Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    p = Path(path)
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        raise EtudeError(f"no safetensors weights at {p}")
    return load_file(str(p))
