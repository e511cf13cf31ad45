"""How long the scheduler simulator takes for 10,000 requests (goal: under 10 s on one core).

Prints the wall time of each run and its ratio to the goal (< 1.0 meets it). Not a test:
timings depend on the machine. Run: ``python benchmarks/bench_simulator.py [--requests N]``.
"""
from __future__ import annotations

import argparse
import time

from servebook.simulator import SchedulerConfig, simulate, synthetic_workload

GOAL_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    parser.add_argument("--policies", default="paged,contiguous,static")
    args = parser.parse_args()
    t0 = time.perf_counter()
    requests = synthetic_workload(args.requests, arrival_rate_per_s=args.rate, max_model_len=2048, seed=0)
    print(f"workload: {args.requests} sharegpt-like requests at {args.rate}/s, built in {time.perf_counter() - t0:.2f} s")
    for policy in args.policies.split(","):
        config = SchedulerConfig(num_blocks=4096, block_size=16, max_num_seqs=256,
                                 max_num_batched_tokens=8192, max_model_len=2048, policy=policy)
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(requests, config)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = result.summary()
        # CPU time is what one core spends; wall time also counts other processes on a shared machine.
        print(f"{policy:10s} cpu {cpu:6.2f} s (wall {wall:6.2f} s)  ratio to {GOAL_S:.0f} s goal: {cpu / GOAL_S:.2f}  "
              f"({s['num_steps']} steps, {s['preemptions']} preemptions, "
              f"{s['output_tokens_per_s']:.0f} output tok/s simulated)")


if __name__ == "__main__":
    main()
