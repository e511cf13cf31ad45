"""Run inside .venv-vllm: start a tiny dummy-weight Llama with LLM(...) and generate greedily.

Prints one line ``SERVEBOOK_RESULT {json}`` (vLLM logs to stdout too): {"vllm": version, "outputs": [[token ids]...], "texts": [...]}.
"""
import json
import sys
import tempfile

from servebook.tiny_model import write_model_dir


def main() -> None:
    from vllm import LLM, SamplingParams
    import vllm

    model_dir = write_model_dir(tempfile.mkdtemp(prefix="tiny-llama-"))
    llm = LLM(model=str(model_dir), load_format="dummy", max_model_len=512, max_num_seqs=4,
              enforce_eager=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate(["hello world", "tell me a story about a cat"], params)
    print("SERVEBOOK_RESULT " + json.dumps({
        "vllm": vllm.__version__,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
        "prompt_token_counts": [len(o.prompt_token_ids) for o in outs],
    }), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
