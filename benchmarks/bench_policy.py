"""Policy sampling throughput: prefix reuse and batching across trees (issue 5, item 7).

Same run, same model, same seeds. Two rounds of expansions over B arithmetic trees: the roots,
then one child per tree (the root plus its gold first tool call and the real tool result), K
samples per expansion. Modes:

  (a) one call per expansion, no cache reuse (every row encodes its whole prompt);
  (b) one call for all trees of a round, no cache reuse;
  (c) one call for all trees of a round, with prefix reuse (shared system prompt encoded once,
      each prompt once, children reuse their parent's prompt from the LRU);
  (g) reference: transformers `model.generate(num_return_sequences=K)` per expansion.

Prints generated tokens/s and prefill tokens per expansion, and ratios against (a).
Timings on a shared 2-core machine are noisy; compare ratios within one run.

    .venv/bin/python benchmarks/bench_policy.py            # SmolLM2, B=4, K=8, 32 new tokens
    .venv/bin/python benchmarks/bench_policy.py --quick    # tiny model, B=2, K=2, 8 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_states(n_trees: int):
    """Round 1: the B root conversations; round 2: each root plus its gold first call and result."""
    from dataengine.env import ToolEnv
    from dataengine.parsing import render_tool_calls
    from dataengine.policy import Conversation
    from dataengine.suites import generate_suite
    from dataengine.tools.sandbox import Sandbox

    tasks = generate_suite("arithmetic", n_trees, 0, seed=0)
    with Sandbox(workers=1) as sandbox:
        env = ToolEnv(sandbox)
        roots = [env.reset(t) for t in tasks]
        children = [o.state for o in env.step_many(roots, [render_tool_calls(t.gold.calls[:1]) for t in tasks])]
    as_conv = lambda s: Conversation(s.messages, s.task.tools)  # noqa: E731
    return [[as_conv(s) for s in roots], [as_conv(s) for s in children]]


def run_mode(policy, rounds, k, max_new_tokens, per_expansion: bool):
    policy.stats.reset()
    samples = []
    start = time.perf_counter()
    for states in rounds:
        if per_expansion:
            for conv in states:
                samples += policy.sample([conv], k, max_new_tokens=max_new_tokens, seed=0)
        else:
            samples += policy.sample(states, k, max_new_tokens=max_new_tokens, seed=0)
    wall = time.perf_counter() - start
    stats = policy.stats.as_dict()
    return wall, stats, [[s.token_ids for s in row] for row in samples]


def run_generate(policy, rounds, k, max_new_tokens):
    """transformers generate per expansion (sampling, K return sequences)."""
    import torch

    model, tok = policy.model, policy.tokenizer
    generated, prefill = 0, 0
    start = time.perf_counter()
    for states in rounds:
        for conv in states:
            ids = torch.tensor([policy.encode(conv)])
            torch.manual_seed(0)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                num_return_sequences=k,
                max_new_tokens=max_new_tokens,
                eos_token_id=policy.eos_ids,
                pad_token_id=tok.pad_token_id,
            )
            new = out[:, ids.shape[1] :]
            # Count tokens up to and including the first end-of-turn token of each row.
            for row in new.tolist():
                n = next((i + 1 for i, t in enumerate(row) if t in policy.eos_ids), len(row))
                generated += n
            prefill += ids.shape[1] * k
    return time.perf_counter() - start, generated, prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny or a folder")
    parser.add_argument("--trees", type=int, default=4, help="B: trees expanded together")
    parser.add_argument("--k", type=int, default=8, help="K: samples per expansion")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="tiny model, B=2, K=2, 8 tokens")
    parser.add_argument("--no-generate", action="store_true", help="skip the model.generate reference")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.quick:
        args.model, args.trees, args.k, args.max_new_tokens = "tiny", 2, 2, 8

    import torch

    from dataengine.policy.hf import HFPolicy

    torch.manual_seed(0)
    rounds = build_states(args.trees)
    base = HFPolicy.load(args.model)
    plain = HFPolicy(base.model, base.tokenizer, prefix_reuse=False)
    reuse = HFPolicy(base.model, base.tokenizer, prefix_reuse=True)
    expansions = sum(len(r) for r in rounds)
    prompt_tokens = [len(plain.encode(c)) for r in rounds for c in r]
    print(f"model={args.model} threads={torch.get_num_threads()} trees={args.trees} K={args.k} "
          f"max_new_tokens={args.max_new_tokens} expansions={expansions} "
          f"prompt tokens mean={sum(prompt_tokens) / len(prompt_tokens):.0f}")

    # Warm-up (allocator, kernels) outside the timings.
    plain.sample(rounds[0][:1], 1, max_new_tokens=2)

    results = {}
    outputs = {}
    for name, policy, per_exp in (
        ("a_per_expansion", plain, True),
        ("b_batched", plain, False),
        ("c_batched_prefix_reuse", reuse, False),
    ):
        wall, stats, outputs[name] = run_mode(policy, rounds, args.k, args.max_new_tokens, per_exp)
        results[name] = {
            "seconds": wall,
            "generated_tokens": stats["generated_tokens"],
            "generated_tokens_per_s": stats["generated_tokens"] / wall,
            "prefill_tokens_per_expansion": stats["prefill_tokens"] / expansions,
            "cached_tokens_per_expansion": stats["cached_tokens"] / expansions,
        }
        print(f"{name}: {wall:.1f} s, {results[name]['generated_tokens_per_s']:.1f} generated tok/s", flush=True)
    if not args.no_generate:
        wall, generated, prefill = run_generate(plain, rounds, args.k, args.max_new_tokens)
        results["g_hf_generate_per_expansion"] = {
            "seconds": wall,
            "generated_tokens": generated,
            "generated_tokens_per_s": generated / wall,
            "prefill_tokens_per_expansion": prefill / expansions,
            "cached_tokens_per_expansion": 0.0,
        }

    a = results["a_per_expansion"]
    print(f"\n{'mode':32s} {'seconds':>8s} {'gen tok':>8s} {'gen tok/s':>10s} {'prefill/exp':>12s} {'speed vs a':>10s} {'prefill vs a':>12s}")
    for name, r in results.items():
        print(
            f"{name:32s} {r['seconds']:8.2f} {r['generated_tokens']:8d} {r['generated_tokens_per_s']:10.1f} "
            f"{r['prefill_tokens_per_expansion']:12.0f} {r['generated_tokens_per_s'] / a['generated_tokens_per_s']:9.2f}x "
            f"{r['prefill_tokens_per_expansion'] / a['prefill_tokens_per_expansion']:11.3f}x"
        )
    same = outputs["a_per_expansion"] == outputs["b_batched"] == outputs["c_batched_prefix_reuse"]
    rows = [x for row in outputs["a_per_expansion"] for x in row]
    agree = sum(
        x == y == z
        for ra, rb, rc in zip(outputs["a_per_expansion"], outputs["b_batched"], outputs["c_batched_prefix_reuse"])
        for x, y, z in zip(ra, rb, rc)
    )
    print(f"\nsame samples in a, b, c: {same} ({agree}/{len(rows)} sequences identical; seeded per row)")
    ratio = results["c_batched_prefix_reuse"]["generated_tokens_per_s"] / a["generated_tokens_per_s"]
    print(f"target (c) >= 5x (a): {ratio:.2f}x -> {'met' if ratio >= 5 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": results, "identical_sequences": agree, "sequences": len(rows)}, handle, indent=1)


if __name__ == "__main__":
    main()
