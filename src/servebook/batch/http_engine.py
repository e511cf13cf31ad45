"""The batch driver's engine over HTTP: a running ``vllm serve`` (OpenAI-compatible API).

For comparing with the offline ``LLM`` class (section 6.23, tactic 3) the same chunks go
to ``/v1/completions`` as token-id prompts, ``concurrency`` requests in flight at once
(threads, standard library only), with ``return_token_ids`` so results are comparable.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from servebook.batch.requests import BatchRequest
from servebook.errors import ServebookError


def _post(url: str, body: dict, timeout_s: float) -> dict:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise ServebookError(f"{url} answered {exc.code}: {exc.read()[:500]!r}") from None
    except urllib.error.URLError as exc:
        raise ServebookError(f"cannot reach {url} ({exc.reason}); is `vllm serve` running there?") from None


def completion_body(model: str, request: BatchRequest, token_ids: Sequence[int]) -> dict:
    """The ``/v1/completions`` body for one request (token-id prompt, its sampling fields)."""
    body = {"model": model, "prompt": list(token_ids), "max_tokens": request.max_tokens,
            "return_token_ids": True, "stream": False}
    body.update(request.sampling)
    return body


def record_from_completion(request_id: str, response: dict) -> dict:
    """The driver's result record from a ``/v1/completions`` response."""
    choice = response["choices"][0]
    usage = response.get("usage") or {}
    return {"id": request_id, "prompt_tokens": usage.get("prompt_tokens"),
            "token_ids": list(choice.get("token_ids") or []), "text": choice.get("text", ""),
            "finish_reason": choice.get("finish_reason")}


class HttpEngine:
    """Completions against ``base_url`` (e.g. ``http://127.0.0.1:8000``) with ``concurrency`` in flight."""

    def __init__(self, base_url: str, model: str, max_model_len: int, *, concurrency: int = 64,
                 timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.model, self.max_model_len = model, int(max_model_len)
        self.concurrency, self.timeout_s = concurrency, timeout_s

    def prompt_token_ids(self, request: BatchRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        out = _post(f"{self.base_url}/tokenize", {"model": self.model, "prompt": request.prompt}, self.timeout_s)
        return list(out["tokens"])

    def generate(self, requests: Sequence[BatchRequest], token_ids: Sequence[Sequence[int]]) -> list[dict]:
        url = f"{self.base_url}/v1/completions"

        def one(pair):
            req, ids = pair
            return record_from_completion(req.id, _post(url, completion_body(self.model, req, ids), self.timeout_s))

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, zip(requests, token_ids)))
