"""``servebook simulate``: runs, prints JSON, and refuses impossible settings with exit 2."""
import json

from servebook.cli import main


def test_simulate_json_summary(capsys):
    assert main(["simulate", "--requests", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["num_requests"] == 30 and data["summary"]["policy"] == "paged"
    assert data["config"]["block_size"] == 16


def test_simulate_policies_and_steps(capsys):
    for policy in ("paged", "contiguous", "static"):
        assert main(["simulate", "--requests", "12", "--policy", policy, "--json", "--steps"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["summary"]["policy"] == policy
        assert len(data["steps"]["scheduled_tokens"]) == data["summary"]["num_steps"]
        assert max(data["steps"]["scheduled_tokens"]) <= data["config"]["max_num_batched_tokens"]
        # No preemption and no shared prefix: every prompt token is computed once and every output
        # token but the last is fed back once, so the steps carry sum(prompt + output - 1) tokens.
        assert data["summary"]["preemptions"] == 0
        expected = sum(r["prompt_tokens"] + r["output_tokens"] - 1 for r in data["requests"])
        assert sum(data["steps"]["scheduled_tokens"]) == expected


def test_simulate_text_and_errors(capsys):
    assert main(["simulate", "--requests", "10"]) == 0
    assert "KV holding tokens" in capsys.readouterr().out
    assert main(["simulate", "--requests", "10", "--num-blocks", "2"]) == 2
    err = capsys.readouterr().err
    assert "num_blocks" in err and "Traceback" not in err
