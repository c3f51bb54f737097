"""A vLLM policy for GPU machines, behind the same interface as `LocalPolicy`.

`vllm` is imported only when a `VLLMPolicy` is built (it is an optional extra and is not
installed on CPU machines), so importing this module is always safe.

Log-probs: the engine is created with `logprobs_mode="processed_logprobs"` so the log-prob
reported for each sampled token is of the distribution actually sampled from (after
temperature and top-p), matching `LocalPolicy`'s contract; older vLLM versions without that
option report raw-model log-probs, which the trainer's truncated importance sampling absorbs.

Weight updates: `load_weights` pushes a state dict into the running engine through the model
runner's `load_weights` (the in-place path vLLM's RL integrations use). A directory is loaded
by rebuilding the engine (slower, always works).

Not tested on this project's CPU build machine (no GPU, no vllm wheel): the code follows
vLLM's documented offline API (`LLM`, `SamplingParams`, `LLM.chat`/`LLM.generate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.types import Generation, Message

from .local import render_messages


class VLLMPolicy:
    native_tools = False

    def __init__(self, model_dir: str | Path, *, id: str | None = None, version: int = 0, **engine_kw: Any):
        try:
            import vllm
        except ImportError as e:
            raise EtudeError("the vLLM backend needs the 'vllm' extra on a GPU machine (pip install etude[vllm])") from e
        self._vllm = vllm
        self.model_dir = str(model_dir)
        self.id = id or Path(self.model_dir).name
        self.version = version
        self.engine_kw = {"logprobs_mode": "processed_logprobs", **engine_kw}
        self.llm = self._engine()
        self.tokenizer = self.llm.get_tokenizer()

    def _engine(self) -> Any:
        try:
            return self._vllm.LLM(model=self.model_dir, **self.engine_kw)
        except TypeError:  # a vLLM without logprobs_mode
            kw = {k: v for k, v in self.engine_kw.items() if k != "logprobs_mode"}
            return self._vllm.LLM(model=self.model_dir, **kw)

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (), *, max_tokens: int = 512,
                 temperature: float = 0.7, top_p: float = 1.0, seed: int | None = None) -> Generation:
        return self.generate_batch([messages], tools, n=1, max_tokens=max_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed)[0]

    def generate_batch(self, conversations: Sequence[Sequence[Message]], tools: Sequence[dict[str, Any]] = (), *,
                       n: int = 1, max_tokens: int = 512, temperature: float = 0.7, top_p: float = 1.0,
                       seed: int | None = None) -> list[Generation]:
        """`n` samples per conversation, flat and prompt-major (same as LocalPolicy)."""
        prompts = [self.tokenizer.apply_chat_template(render_messages(m), add_generation_prompt=True, tokenize=True)
                   for m in conversations]
        sp = self._vllm.SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                       logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sp)
        gens = []
        for prompt, out in zip(prompts, outs, strict=True):
            for c in out.outputs:
                lps = [next(iter(d.values())).logprob if d else 0.0 for d in (c.logprobs or [])]
                gens.append(Generation(text=c.text, prompt_token_ids=tuple(prompt), token_ids=tuple(c.token_ids),
                                       logprobs=tuple(lps), finish_reason="stop" if c.finish_reason == "stop" else "length",
                                       policy_id=self.id, policy_version=self.version))
        return gens

    def load_weights(self, weights: Mapping[str, Any] | str | Path, *, version: int | None = None) -> int:
        if isinstance(weights, (str, Path)):
            self.model_dir = str(weights)
            self.llm = self._engine()
        else:
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
            runner.model.load_weights(weights=list(weights.items()))
        self.version = self.version + 1 if version is None else int(version)
        return self.version
