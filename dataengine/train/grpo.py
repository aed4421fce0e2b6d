"""Online GRPO with tools executing during rollouts (TRL GRPOTrainer + environment_factory).

Reads prompt rows {"prompt", "tools", "task_id", "task_json"} (see dataengine.train.data). For
each prompt TRL samples `num_generations` rollouts; whenever the model writes
`<tool_call>{...}</tool_call>` the call runs in our sandboxed ToolEnv (dataengine.train.
environment) and the result comes back as a tool turn, up to `max_tool_calls` times. Tool-result
tokens are masked out of the loss (TRL's tool_mask). The reward is our CompositeReward on the
rebuilt Episode, so training optimises the same verifiers search used.

Zero-variance groups: offline, `drop_zero_variance` removes prompts whose logged p_success is 0 or
1 (load_training_data); online, a group whose rollouts all get the same reward has advantage 0 in
TRL (scale_rewards="group") and contributes no policy gradient; the share is logged as
`frac_reward_zero_std`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from dataengine.config import GRPOTrainConfig
from dataengine.models import weights_fingerprint
from dataengine.train.base import load_for_training, peft_config, train_metrics, training_heap, trl_kwargs
from dataengine.train.checkpoint import CheckpointInfo, finish_training, parent_model_id
from dataengine.train.data import TrainingData, as_training_data
from dataengine.train.environment import environment_factories, final_reply, regroup_turns
from dataengine.train.progress import attach_progress

log = logging.getLogger(__name__)


def verifier_reward(composite: Any) -> Callable[..., list[float]]:
    """A TRL reward function: rebuild each rollout's Episode from its environment and score it
    with `composite` (a CompositeReward). Logs the success rate and the tool-call count."""

    def reward(prompts: list[Any], completions: list[Any], environments: list[Any] | None = None, **kwargs: Any) -> list[float]:
        if environments is None:
            raise RuntimeError("verifier_reward needs GRPOTrainer(environment_factory=...) environments")
        rewards, successes, calls = [], [], []
        for completion, environment in zip(completions, environments, strict=True):
            episode = regroup_turns(environment._episode(final_reply(completion)), completion, environment._prefix_steps)
            result = composite.score(episode)
            rewards.append(float(result.reward))
            successes.append(float(result.success))
            calls.append(float(len(episode.calls)))
        log_metric = kwargs.get("log_metric")
        if log_metric is not None and rewards:
            log_metric("verifier/success_rate", sum(successes) / len(successes))
            log_metric("verifier/tool_calls_per_rollout", sum(calls) / len(calls))
        return rewards

    reward.__name__ = "verifier_reward"
    return reward


def _with_environment_column(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Add TRL's routing column "environment" (the task's toolbox) to every row."""
    out, toolboxes = [], []
    for row in rows:
        toolbox = json.loads(row["task_json"]).get("toolbox")
        if not toolbox:
            raise ValueError(f"task {row.get('task_id')}: task_json has no toolbox")
        toolboxes.append(toolbox)
        out.append({**row, "environment": toolbox})
    return out, toolboxes


def build_grpo_trainer(
    config: GRPOTrainConfig, data: TrainingData, tool_env: Any, composite: Any
) -> tuple[Any, Any, Any]:
    """(trainer, model, tokenizer) ready to train, rolling out through `tool_env`."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer


    rows, toolboxes = _with_environment_column(data.rows)
    model, tokenizer = load_for_training(config)
    # GRPOTrainer generates from left-padded prompts; train_grpo restores the side before saving.
    tokenizer._dataengine_padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    kwargs = trl_kwargs(config)
    args = GRPOConfig(
        **kwargs,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        max_tool_calling_iterations=config.max_tool_calls,
        temperature=config.temperature,
        beta=config.beta,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        mask_truncated_completions=config.mask_truncated_completions,
        use_vllm=config.use_vllm,
        generation_kwargs=config.generation_kwargs,
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[verifier_reward(composite)],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config(config),
        environment_factory=environment_factories(toolboxes, tool_env),
    )
    attach_progress(trainer, "grpo")
    return trainer, model, tokenizer


@training_heap
def train_grpo(
    config: GRPOTrainConfig,
    dataset: Any,
    store: Any = None,
    *,
    composite: Any = None,
) -> CheckpointInfo:
    """Run online GRPO and write a checkpoint to config.out_dir; register it in `store` when given.

    dataset: TrainingData (from load_training_data("prompt", ...)), a datasets.Dataset, a list of
        prompt rows, or a path to an exported replay set.
    composite: the reward (default: CompositeReward() with ToolEnv.replay for end states).
    """
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox
    from dataengine.verifiers import CompositeReward

    data = as_training_data("prompt", dataset)
    with Sandbox(workers=config.sandbox_workers, timeout_s=config.tool_timeout_s) as sandbox:
        tool_env = ToolEnv(sandbox, max_steps=config.max_episode_steps)
        reward = composite if composite is not None else CompositeReward(replay=tool_env.replay)
        trainer, model, tokenizer = build_grpo_trainer(config, data, tool_env, reward)
        parent = parent_model_id(config.init, model)
        before = weights_fingerprint(model)
        output = trainer.train()
    tokenizer.padding_side = getattr(tokenizer, "_dataengine_padding_side", tokenizer.padding_side)
    metrics = train_metrics(output, trainer, rows=len(data))
    for key in ("reward", "verifier/success_rate", "frac_reward_zero_std", "tools/call_frequency"):
        values = [entry[key] for entry in trainer.state.log_history if key in entry]
        if values:
            metrics[f"mean_{key}"] = sum(values) / len(values)
    versions = reward.versions() if hasattr(reward, "versions") else None
    info = finish_training(trainer, tokenizer, config, data, kind="grpo", parent_id=parent, metrics=metrics,
                           store=store, verifier_versions=versions, before=before)
    log.info("grpo checkpoint %s at %s", info.model_id, info.path)
    return info
