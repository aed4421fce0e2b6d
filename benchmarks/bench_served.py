"""A served model as the policy against the in-process backends: one search batch, same prompts.

One search batch here is the search's two rounds of expansions over B arithmetic trees (the
roots, then one child per tree: the root plus its gold first call and the real tool result, so
round 2 shares round 1's prompts as prefixes), K samples per state, temperature 1, the same
seeds. Modes:

  vllm            `VLLMPolicy`, the in-process engine (the baseline every ratio is against).
  served          `OpenAIPolicy` against a local vLLM server (vllm_server_command), prefix caching on.
  served_nocache  the same server with `--no-enable-prefix-caching`.
  hf              `HFPolicy`, with `--hf` (slow on a loaded CPU).

Servers and engines start one at a time and their start-up is not timed; a short warm-up call
per mode runs first. Prints generated tokens/s, wall seconds and cached prompt tokens per mode,
and each mode's ratios to `vllm` measured in the same run. Run in vLLM's environment:

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=. .venv-vllm/bin/python benchmarks/bench_served.py            # SmolLM2, B=8, K=4, 32 tokens
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=. .venv-vllm/bin/python benchmarks/bench_served.py --quick    # B=2, K=2, 8 tokens
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from bench_policy import build_states  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_batch(policy, rounds, k: int, max_new_tokens: int) -> dict:
    """Both rounds through `policy`: wall seconds, generated tokens, prompt tokens served from cache."""
    policy.sample(rounds[0][:1], 1, max_new_tokens=2, seed=99)  # warm-up: not timed
    before = policy.stats.as_dict()
    start = time.perf_counter()
    rows = []
    for i, convs in enumerate(rounds):
        rows.append(policy.sample(convs, k, max_new_tokens=max_new_tokens, temperature=1.0, seed=i))
    wall = time.perf_counter() - start
    after = policy.stats.as_dict()
    tokens = after["generated_tokens"] - before["generated_tokens"]
    return {
        "wall_s": wall,
        "generated_tokens": tokens,
        "tok_per_s": tokens / wall,
        "cached_tokens": after["cached_tokens"] - before["cached_tokens"],
        "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
        "token_ids": [[s.token_ids for s in row] for rnd in rows for row in rnd],
    }


def served_mode(rounds, args, *, prefix_caching: bool) -> dict:
    from dataengine.models import model_folder
    from dataengine.policy import make_policy
    from dataengine.policy.openai import vllm_server_command, wait_until_served

    port = free_port()
    cmd = vllm_server_command(str(model_folder(args.model)), port=port, served_model=args.model,
                              prefix_caching=prefix_caching, python=sys.executable)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started = time.perf_counter()
            wait_until_served(f"http://127.0.0.1:{port}/v1", proc, timeout_s=900)
            startup = time.perf_counter() - started
            policy = make_policy("openai", args.model, base_url=f"http://127.0.0.1:{port}/v1", concurrency=args.concurrency,
                                 timeout_s=600)
            result = run_batch(policy, rounds, args.k, args.max_new_tokens)
            policy.close()
            result["startup_s"] = startup
            return result
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)


def in_process_mode(name: str, rounds, args) -> dict:
    from dataengine.policy import make_policy

    started = time.perf_counter()
    policy = make_policy("vllm", args.model, dtype="float32") if name == "vllm" else make_policy("hf", args.model)
    startup = time.perf_counter() - started
    result = run_batch(policy, rounds, args.k, args.max_new_tokens)
    result["startup_s"] = startup
    if name == "vllm":
        del policy.engine  # frees the engine's KV cache before the next mode starts
    del policy
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--trees", type=int, default=8, help="B: trees (states per round)")
    parser.add_argument("--k", type=int, default=4, help="K: samples per state")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8, help="served: requests in flight")
    parser.add_argument("--hf", action="store_true", help="also the hf backend")
    parser.add_argument("--quick", action="store_true", help="B=2, K=2, 8 new tokens")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("bench_served: skipped, vLLM is not installed here; run it with .venv-vllm/bin/python (module doc)")
        return
    if args.quick:
        args.trees, args.k, args.max_new_tokens = 2, 2, 8
    rounds = build_states(args.trees)
    results = {"vllm": in_process_mode("vllm", rounds, args)}
    results["served"] = served_mode(rounds, args, prefix_caching=True)
    results["served_nocache"] = served_mode(rounds, args, prefix_caching=False)
    if args.hf:
        results["hf"] = in_process_mode("hf", rounds, args)
    base = results["vllm"]
    same = {name: r["token_ids"] == base["token_ids"] for name, r in results.items()}
    print(f"one search batch: B={args.trees} trees x 2 rounds, K={args.k}, {args.max_new_tokens} new tokens, model {args.model}")
    print(f"{'mode':<16}{'tok/s':>9}{'wall s':>9}{'tokens':>8}{'cached':>8}{'tok/s vs vllm':>15}{'wall vs vllm':>14}  same tokens as vllm")
    for name, r in results.items():
        print(f"{name:<16}{r['tok_per_s']:>9.1f}{r['wall_s']:>9.2f}{r['generated_tokens']:>8}{r['cached_tokens']:>8}"
              f"{r['tok_per_s'] / base['tok_per_s']:>15.2f}{r['wall_s'] / base['wall_s']:>14.2f}  {same[name]}")
    cache = results["served"]["wall_s"] / results["served_nocache"]["wall_s"]
    print(f"served wall time with prefix caching / without: {cache:.2f}")
    if args.json:
        args.json.write_text(json.dumps({n: {k: v for k, v in r.items() if k != "token_ids"} for n, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
