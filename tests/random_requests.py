"""Random workloads for the simulator's property tests (hypothesis), shared by the test modules."""
from hypothesis import strategies as st

from servebook.simulator import RequestSpec


def raw_requests(max_prompt: int = 120, max_output: int = 60, max_arrival_s: float = 2, max_size: int = 25):
    """``(prompt, output, arrival_s, shares_prefix)`` tuples; :func:`fitting_requests` makes them requests."""
    return st.lists(st.tuples(st.integers(1, max_prompt), st.integers(1, max_output), st.floats(0, max_arrival_s),
                              st.booleans()), min_size=1, max_size=max_size)


def fitting_requests(raw, num_blocks: int, block_size: int, max_model_len: int) -> list[RequestSpec]:
    """Requests from ``raw``, shortened so each fits ``max_model_len`` and the pool; a request that
    shares a prefix shares its first 24 tokens (or its whole prompt if shorter)."""
    requests = []
    for i, (prompt, output, arrival, shared) in enumerate(raw):
        total_cap = min(max_model_len, num_blocks * block_size + 1)
        prompt = min(prompt, total_cap - 1)
        output = max(1, min(output, total_cap - prompt))
        prefix = min(prompt, 24) if shared else 0
        requests.append(RequestSpec(f"r{i}", prompt, output, arrival, "p" if prefix else None, prefix))
    return requests
