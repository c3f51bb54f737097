"""Code that runs inside vLLM's worker process (`worker_extension_cls` of VLLMPolicy's engine).

vLLM mixes `EtudeWorkerExtension` into its worker class, so
`LLM.collective_rpc("etude_load_weights", args=(path,))` runs the method there, with the worker
as `self`. Imported only by that worker.

What it adds to vLLM's in-place reload (`Worker.reload_weights`, which re-runs each layer's
post-load processing — on CPU the linear layers are repacked for oneDNN, so plain
`model.load_weights` cannot write into them): a tied LM head. SmolLM2 ties its head to the
embedding; the checkpoint has no head tensor, and vllm 0.32's layer-wise reload then puts the
head's *old* tensors back, untying it (measured: |Δ log p| 0.64 against the learner after a
sync instead of ~0.002). After the reload I tie the head to the new embedding again and re-run
its post-load processing, as at start-up.
"""

from __future__ import annotations

from typing import Any


class EtudeWorkerExtension:
    def etude_load_weights(self: Any, path: str) -> int:
        """Reload the running model in place from a safetensors file of Hugging Face-named
        tensors; returns how many tensors the file held."""
        from safetensors.torch import load_file

        state = load_file(path)
        self.reload_weights(weights_iterator=iter(state.items()))
        model = self.model_runner.get_model()
        hf = self.model_runner.model_config.hf_config
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if getattr(hf, "tie_word_embeddings", False) and head is not None and embed is not None:
            head.quant_method.tie_weights(head, embed)
            head.quant_method.process_weights_after_loading(head)
        return len(state)
