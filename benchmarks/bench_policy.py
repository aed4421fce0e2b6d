"""Policy sampling throughput: the `hf` backend against the strongest baseline of the same run.

Same run, same model, same prompts, same sampling settings (temperature 1, top-p 1, K samples,
`--max-new-tokens`). Two rounds of expansions over B arithmetic trees: the roots, then one child
per tree (the root plus its gold first tool call and the real tool result). Modes:

  generate     transformers `model.generate(num_return_sequences=K)`, one call per round over the
               B prompts (left-padded): every prompt is encoded K times.
  copy_k       encode each prompt once (one batched forward per round), copy its keys/values K
               times, decode with `model.generate` over the prefilled cache.
  new          `HFPolicy`: canonical prefix blocks, one copy of each prompt's keys/values for its
               K samples, one product over the prefix all prompts share, bit-identical per row.
  vllm         `VLLMPolicy` when vLLM imports, with the backend's engine defaults (on CPU eager
               mode); engine start-up reported apart, not timed.
  vllm_compiled  the same with vLLM's own default, torch.compile (`enforce_eager=False`): minutes
               of compile at start-up on CPU, then its fastest decoding.

Each policy's cache starts empty; a short warm-up call per mode runs first. Prints generated
tokens/s per mode and the ratio of each to the strongest baseline (the fastest mode other than
`new`), and how many sequences `new` shares token for token with transformers' `generate` given
the same per-row draws (dataengine.policy.reference; untimed, checked after the timed modes).

    .venv/bin/python benchmarks/bench_policy.py            # SmolLM2, B=8, K=8, 32 new tokens
    .venv/bin/python benchmarks/bench_policy.py --quick    # tiny model, B=2, K=2, 8 tokens, 1 thread
    .venv/bin/python benchmarks/bench_policy.py --modes new --profile   # where `new` spends its time
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODES = ("generate", "copy_k", "new", "vllm", "vllm_compiled")
# vllm_compiled is asked for by name: its start-up takes minutes, and one engine per run is safest.
DEFAULT_MODES = MODES[:-1]


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


def run_policy(policy, rounds, k, max_new_tokens):
    """One `sample` call per round. Returns (seconds, stats, token ids per sequence)."""
    policy.stats.reset()
    samples = []
    start = time.perf_counter()
    for states in rounds:
        samples += policy.sample(states, k, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=0)
    wall = time.perf_counter() - start
    ids = [s.token_ids for row in samples for s in row]
    return wall, policy.stats.as_dict(), ids


def _left_pad(prompts, pad_id):
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _count_generated(new_tokens, eos_ids):
    """Tokens up to and including the first end-of-turn token of each row."""
    return sum(next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row)) for row in new_tokens.tolist())


def run_generate(policy, rounds, k, max_new_tokens, copy_k: bool):
    """transformers generate, one call per round over all B prompts: K encodings of each prompt,
    or (copy_k) one batched prefill whose keys/values are copied K times."""
    import torch
    from transformers import DynamicCache

    model, tok = policy.model, policy.tokenizer
    generated = prefill = 0
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        for states in rounds:
            prompts = [policy.encode(c) for c in states]
            ids, mask = (t.to(model.device) for t in _left_pad(prompts, tok.pad_token_id))
            kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                          eos_token_id=policy.eos_ids, pad_token_id=tok.pad_token_id)
            if copy_k:
                cache = DynamicCache(config=model.config)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1],
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache.batch_repeat_interleave(k)
                out = model.generate(input_ids=ids.repeat_interleave(k, 0), attention_mask=mask.repeat_interleave(k, 0),
                                     past_key_values=cache, **kwargs)
                prefill += int(mask.sum())
            else:
                out = model.generate(input_ids=ids, attention_mask=mask, num_return_sequences=k, **kwargs)
                prefill += int(mask.sum()) * k
            generated += _count_generated(out[:, ids.shape[1] :], policy.eos_ids)
    return time.perf_counter() - start, generated, prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny or a folder")
    parser.add_argument("--trees", type=int, default=8, help="B: trees expanded together")
    parser.add_argument("--k", type=int, default=8, help="K: samples per expansion")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda when present)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="tiny model, B=2, K=2, 8 tokens, 1 thread (a smoke test)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's top CPU ops of the new mode")
    args = parser.parse_args()
    if args.quick:
        # One thread: on a shared machine OpenMP threads wait on each other behind other processes.
        args.model, args.trees, args.k, args.max_new_tokens = "tiny", 2, 2, 8
        args.threads = args.threads or 1
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown mode(s) {unknown}; choose from {list(MODES)}")

    import torch

    from dataengine.policy.hf import HFPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = build_states(args.trees)
    new = HFPolicy.load(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    expansions = sum(len(r) for r in rounds)
    prompt_tokens = [len(new.encode(c)) for r in rounds for c in r]
    print(f"model={args.model} device={new.device} "
          f"dtype={args.dtype} threads={torch.get_num_threads()} trees={args.trees} K={args.k} "
          f"max_new_tokens={args.max_new_tokens} expansions={expansions} "
          f"prompt tokens mean={sum(prompt_tokens) / len(prompt_tokens):.0f}", flush=True)

    results: dict[str, dict] = {}
    outputs: dict[str, list] = {}
    warm = [rounds[0][:1]]
    for mode in modes:
        if mode in ("generate", "copy_k"):
            run_generate(new, warm, 1, 2, copy_k=mode == "copy_k")
            wall, generated, prefill = run_generate(new, rounds, args.k, args.max_new_tokens, copy_k=mode == "copy_k")
            results[mode] = {"seconds": wall, "generated_tokens": generated, "prefill_tokens": prefill}
        elif mode in ("new", "vllm", "vllm_compiled"):
            policy = new if mode == "new" else None
            if mode.startswith("vllm"):
                try:
                    from dataengine.policy import make_policy

                    began = time.perf_counter()
                    options = {"enforce_eager": False} if mode == "vllm_compiled" else {}
                    policy = make_policy("vllm", args.model, **options)
                    startup = time.perf_counter() - began
                except ImportError as exc:
                    print(f"vllm: skipped ({str(exc).splitlines()[0]})", flush=True)
                    continue
            policy.sample(warm[0], 1, max_new_tokens=2)
            if hasattr(policy, "cache"):
                policy.cache.clear()
            if mode == "new" and args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    wall, stats, outputs[mode] = run_policy(policy, rounds, args.k, args.max_new_tokens)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
            else:
                wall, stats, outputs[mode] = run_policy(policy, rounds, args.k, args.max_new_tokens)
            results[mode] = {"seconds": wall, "generated_tokens": int(stats["generated_tokens"]),
                             "prefill_tokens": int(stats["prefill_tokens"])}
            if mode.startswith("vllm"):
                results[mode]["startup_seconds"] = startup
                # One engine at a time: free this one's KV cache and worker before the next.
                del policy
                gc.collect()
        results[mode]["generated_tokens_per_s"] = results[mode]["generated_tokens"] / results[mode]["seconds"]
        print(f"{mode}: {results[mode]['seconds']:.1f} s, {results[mode]['generated_tokens_per_s']:.1f} generated tok/s", flush=True)

    baselines = {m: r for m, r in results.items() if m != "new"}
    best = max(baselines, key=lambda m: baselines[m]["generated_tokens_per_s"]) if baselines else None
    print(f"\n{'mode':10s} {'seconds':>8s} {'gen tok':>8s} {'gen tok/s':>10s} {'prefill/exp':>12s} "
          f"{'vs ' + (best or '-'):>12s}")
    for mode, r in results.items():
        ratio = r["generated_tokens_per_s"] / results[best]["generated_tokens_per_s"] if best else float("nan")
        r["ratio_vs_best_baseline"] = ratio
        print(f"{mode:10s} {r['seconds']:8.2f} {r['generated_tokens']:8d} {r['generated_tokens_per_s']:10.1f} "
              f"{r['prefill_tokens'] / expansions:12.0f} {ratio:11.2f}x")
    for mode in ("vllm", "vllm_compiled"):
        if mode in results:
            print(f"{mode} engine start-up (not in its timing): {results[mode]['startup_seconds']:.1f} s")
    summary = {"args": vars(args), "results": results, "strongest_baseline": best}
    if "new" in outputs:
        from dataengine.policy.reference import generate_reference

        reference = [r.token_ids for states in rounds
                     for row in generate_reference(new, states, args.k, max_new_tokens=args.max_new_tokens, seed=0)
                     for r in row]
        # a sample cut at a stop string is a prefix of its reference
        same = sum(list(a) == b[: len(a)] for a, b in zip(outputs["new"], reference))
        summary["identical_new_generate"] = same
        print(f"\nnew vs transformers generate with the same draws: {same}/{len(reference)} sequences identical "
              "token for token (seeded per row)")
    if "new" in results and best:
        print(f"new: {results['new']['generated_tokens_per_s']:.1f} generated tok/s, "
              f"{results['new']['ratio_vs_best_baseline']:.2f}x the strongest baseline ({best})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)


if __name__ == "__main__":
    main()
