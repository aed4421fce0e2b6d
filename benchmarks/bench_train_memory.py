"""Peak memory of DPO on CPU (SmolLM2-135M, full weights): TRL as it comes against the engine's
CPU settings, measured in the same run, each variant in a fresh process.

Rows: `--pairs` preference pairs whose prompt is about `--prompt-tokens` tokens (a system turn of
filler words, like the ~600-token tool listing and worked examples of the engine's prompts) and a
one-call completion; two pairs per optimizer step, max_length 1024, `--steps` optimizer steps.

Variants:
- trl:        TRL's fused LM head as shipped (on CPU it scores every position, prompt and padding
              included, in 4,096 x 32,768 tiles), a reference model, no activation checkpointing;
- fitted:     the engine's CPU training defaults: fit_fused_head_to_cpu (labelled positions only,
              256-token tiles) and a fixed mmap threshold (dataengine.heap: freed tensors go back
              to the OS at once);
- demo:       fitted + gradient_checkpointing + precompute_ref_log_probs + one pair per micro-step,
              two per optimizer step (what `make demo` uses).

Prints peak RSS (GB) and seconds per variant and each variant's peak as a ratio of `trl`.

    .venv/bin/python benchmarks/bench_train_memory.py
    .venv/bin/python benchmarks/bench_train_memory.py --steps 4 --prompt-tokens 600
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "trl": {"fit": False, "config": {}},
    "fitted": {"fit": True, "config": {}},
    "demo": {"fit": True, "config": {"gradient_checkpointing": True, "precompute_ref_log_probs": True,
                                     "batch_size": 1, "gradient_accumulation_steps": 2}},
}
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}


def rows(pairs: int, prompt_tokens: int) -> list[dict]:
    # "wordN " is about 4 SmolLM2 tokens
    filler = " ".join(f"word{i}" for i in range(prompt_tokens // 4))
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 17, "b": 25}}}
    return [{"prompt": [{"role": "system", "content": filler}, {"role": "user", "content": f"What is {17 + i} plus 25?"}],
             "chosen": [{"role": "assistant", "content": "", "tool_calls": [call]}],
             "rejected": [{"role": "assistant", "content": str(30 + i)}],
             "tools": [ADD_TOOL]} for i in range(pairs)]


def child(variant: str, pairs: int, prompt_tokens: int, steps: int) -> None:
    """One variant in this process; prints a JSON line."""
    sys.path.insert(0, str(ROOT))
    from dataengine.config import DPOTrainConfig
    from dataengine.train import base
    from dataengine.train.dpo import train_dpo

    spec = VARIANTS[variant]
    if not spec["fit"]:
        from dataengine import heap

        base.fit_fused_head_to_cpu = lambda device: None
        heap.map_large_blocks = lambda: None
    settings = {"batch_size": 2, "max_length": 1024, "device": "cpu", "learning_rate": 5e-6, "seed": 0, **spec["config"]}
    config = DPOTrainConfig(init="smollm2", out_dir=tempfile.mkdtemp(), max_steps=steps, **settings)
    start = time.perf_counter()
    info = train_dpo(config, rows(pairs, prompt_tokens))
    print(json.dumps({"variant": variant, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                      "seconds": time.perf_counter() - start, "loss": info.metrics["train_loss"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=900)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pairs, args.prompt_tokens, args.steps)
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = {}
    for variant in args.variants:
        out = subprocess.run([sys.executable, __file__, "--child", variant, "--pairs", str(args.pairs),
                              "--prompt-tokens", str(args.prompt_tokens), "--steps", str(args.steps)],
                             env=env, capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            sys.exit(f"variant {variant} failed:\n{out.stderr[-3000:]}")
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:8s} peak RSS {r['peak_rss_gb']:.2f} GB  {r['seconds']:.0f} s  loss {r['loss']:.4f}", flush=True)
    if "trl" in results:
        for variant, r in results.items():
            print(f"{variant:8s} peak RSS / trl = {r['peak_rss_gb'] / results['trl']['peak_rss_gb']:.2f}")


if __name__ == "__main__":
    main()
