"""The batch driver's engine on vLLM's offline ``LLM`` class (imports vLLM lazily).

Prompts go to the engine as token ids (a ``TokensPrompt``), tokenized once by the
driver with the engine's own tokenizer, so the order the driver computed from those ids
is exactly what the engine sees. One :meth:`VllmEngine.generate` call is one
``LLM.generate`` over a whole chunk: vLLM's scheduler batches it continuously.
"""
from __future__ import annotations

from typing import Sequence

from servebook.batch.requests import BatchRequest
from servebook.errors import ServebookError


def result_record(request_id: str, output) -> dict:
    """The JSON record the driver stores for one ``vllm.RequestOutput``."""
    completion = output.outputs[0]
    return {
        "id": request_id,
        "prompt_tokens": len(output.prompt_token_ids or ()),
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        "finish_reason": completion.finish_reason,
    }


class VllmEngine:
    """``vllm.LLM(model=..., **engine_kwargs)`` behind the driver's Engine interface.

    ``engine_kwargs`` are ``LLM``/``EngineArgs`` keywords (``max_model_len``,
    ``max_num_seqs``, ``enforce_eager``, ``load_format``, ``dtype``, ``seed`` ...).
    """

    def __init__(self, model: str, **engine_kwargs):
        try:
            from vllm import LLM
        except ImportError:
            raise ServebookError(
                "vLLM is not importable in this Python; run the driver with the vLLM environment, e.g. "
                "`.venv-vllm/bin/python -m servebook batch run ...`") from None
        self.llm = LLM(model=model, **engine_kwargs)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._tokenizer = None

    def prompt_token_ids(self, request: BatchRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if self._tokenizer is None:
            self._tokenizer = self.llm.get_tokenizer()
        return list(self._tokenizer.encode(request.prompt))

    def sampling_params(self, request: BatchRequest):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=request.max_tokens, **request.sampling)

    def generate(self, requests: Sequence[BatchRequest], token_ids: Sequence[Sequence[int]]) -> list[dict]:
        prompts = [{"prompt_token_ids": list(t)} for t in token_ids]
        params = [self.sampling_params(r) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [result_record(r.id, o) for r, o in zip(requests, outputs)]

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (the lab does this between variants)."""
        self.llm.reset_prefix_cache()
