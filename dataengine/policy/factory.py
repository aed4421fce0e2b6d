"""The one place a policy is built: a backend name and a model name (or a config section) to a
Policy. It imports the backends lazily, so importing it loads neither transformers nor vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataengine.policy.base import Policy


def make_policy(backend: str = "hf", model: str = "smollm2", *, device: str = "cpu", **options: Any) -> Policy:
    """Build a policy. backend: "hf" (transformers), "vllm" or "openai" (a served model; options
    base_url, tokenizer, endpoint, api_key_env, timeout_s, max_retries, concurrency, see
    `OpenAIPolicy.load`); model: "smollm2", "tiny" or a folder (openai: the served name).

    Both backends take the prompt options fewshot, system, listing and tools; other options go to the
    backend (e.g. prefix_reuse=False for HFPolicy, gpu_memory_utilization for vLLM). `device`
    is the hf backend's ("auto", "cpu", "cuda"); vLLM places its engine itself.
    """
    if backend == "hf":
        from dataengine.policy.hf import HFPolicy

        return HFPolicy.load(model, device=device, **options)
    if backend == "vllm":
        from dataengine.policy.vllm import VLLMPolicy

        return VLLMPolicy.load(model, **options)
    if backend == "openai":
        from dataengine.policy.openai import OpenAIPolicy

        return OpenAIPolicy.load(model, **options)
    raise ValueError(f"unknown policy backend {backend!r}; choose 'hf', 'vllm' or 'openai'")


def policy_from_config(config: Any, tools: Sequence[str] = ()) -> Policy:
    """The policy of a `config.PolicyConfig` section (backend, model, device, few_shot): the one
    factory the stages, flows and CLI use; the openai backend also takes the section's endpoint
    settings. tools: the engine's tools entries (tools.modules), whose toolboxes' example
    episodes the prompt shows (`chat_template.install_prompt_options`)."""
    options: dict[str, Any] = {"tools": list(tools)} if tools else {}
    if config.backend == "openai":
        served = {name: getattr(config, name) for name in ("base_url", "tokenizer", "endpoint", "api_key_env", "timeout_s", "max_retries", "concurrency")}
        return make_policy("openai", config.model, fewshot=config.few_shot, **served, **options)
    return make_policy(config.backend, config.model, device=config.device, fewshot=config.few_shot, **options)
