"""servebook.lab.harness.token_load against a fake streaming server (standard library, no engine).

The fake answers ``/v1/completions`` like vLLM with ``stream`` and ``return_token_ids``: it waits
``FIRST_S`` before the first chunk, then streams one token id per chunk ``GAP_S`` apart, then a
usage-only chunk and ``[DONE]``. Expected times follow from those delays.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servebook.lab.errors import LabError
from servebook.lab.harness.token_load import stream_token_prompts

FIRST_S, GAP_S = 0.20, 0.05


class FakeVllm(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVllm.seen.append(body)
        if body["prompt"] == [0]:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "prompt too long"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_S)
        for i in range(body["max_tokens"]):
            if i:
                time.sleep(GAP_S)
            chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n')


@pytest.fixture(scope="module")
def base_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_times_and_counts_each_request(base_url):
    FakeVllm.seen.clear()
    prompts = [[11, 12, 13], [21, 22], [31]]
    out = stream_token_prompts(base_url, "m", prompts, max_tokens=4)
    rows, s = out["requests"], out["summary"]
    assert [r["prompt_tokens"] for r in rows] == [3, 2, 1]
    assert [r["output_tokens"] for r in rows] == [4, 4, 4]
    # TTFT >= the fake's first delay; the last token cannot arrive before the server sent it,
    # 3 gaps after the first. (Measured from the send, not from the first arrival: on a loaded
    # machine the client may read the first chunks late, so arrival-to-arrival gaps can shrink.)
    assert all(FIRST_S <= r["ttft_s"] < FIRST_S + 1.0 for r in rows)
    assert all(r["latency_s"] >= FIRST_S + 3 * GAP_S for r in rows)
    assert all(r["latency_s"] >= r["ttft_s"] for r in rows)
    # All three in flight at once: the whole run takes about one request, not three.
    assert s["completed"] == 3 and s["max_concurrency"] == 3
    assert s["duration_s"] < 2 * (FIRST_S + 3 * GAP_S) + 0.5
    assert s["output_throughput"] == pytest.approx(12 / s["duration_s"])
    assert s["total_token_throughput"] == pytest.approx((12 + 6) / s["duration_s"])
    # The prompts went as token ids, greedy, ignore_eos, streamed.
    sent = sorted(FakeVllm.seen, key=lambda b: b["prompt"])
    assert [b["prompt"] for b in sent] == [[11, 12, 13], [21, 22], [31]]
    assert all(b["stream"] and b["ignore_eos"] and b["temperature"] == 0 and b["max_tokens"] == 4 for b in sent)


def test_concurrency_limit_serialises(base_url):
    out = stream_token_prompts(base_url, "m", [[1], [2], [3]], max_tokens=1, max_concurrency=1)
    starts = sorted(r["start_s"] for r in out["requests"])
    # One at a time: each starts after the previous one's first-token delay.
    assert all(b - a >= FIRST_S for a, b in zip(starts, starts[1:]))
    assert out["summary"]["max_concurrency"] == 1


def test_a_failed_request_is_reported(base_url):
    with pytest.raises(LabError, match="1 of 2 requests failed.*400"):
        stream_token_prompts(base_url, "m", [[5], [0]], max_tokens=1)
    with pytest.raises(LabError, match="no prompts"):
        stream_token_prompts(base_url, "m", [], max_tokens=1)
