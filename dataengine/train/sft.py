"""Rejection-sampling SFT on successful (or recovered) episodes (TRL SFTTrainer).

Reads rows {"messages", "tools"} (see dataengine.train.data). The loss is on assistant tokens only
(SFTConfig(assistant_only_loss=True)): the chat template wraps each assistant turn, with its
<|im_end|>, in {% generation %} markers, so the prompt, the system block with the tool list and
every <tool_response> get label -100 and are never trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from dataengine.train.base import TrainConfig, train_metrics
from dataengine.train.checkpoint import CheckpointInfo, finish_training, parent_model_id
from dataengine.train.data import TrainingData, as_training_data

log = logging.getLogger(__name__)


@dataclass
class SFTTrainConfig(TrainConfig):
    """Settings of train_sft (TRL SFTConfig underneath)."""

    learning_rate: float = field(default=2e-5, metadata={"help": "Peak AdamW learning rate."})
    assistant_only_loss: bool = field(
        default=True, metadata={"help": "Loss on assistant tokens only (prompts and tool outputs get label -100)."}
    )
    packing: bool = field(default=False, metadata={"help": "Pack several examples into one max_length sequence."})


def build_sft_trainer(config: SFTTrainConfig, data: TrainingData) -> tuple[Any, Any, Any]:
    """(trainer, model, tokenizer) ready to train; trainer.train_dataset holds input_ids and
    labels (-100 off the assistant turns), which tests inspect."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from dataengine.models import load_model

    config.validate()
    model, tokenizer = load_model(config.init, device=config.model_device())
    model.train()
    args = SFTConfig(
        **config.trl_kwargs(),
        assistant_only_loss=config.assistant_only_loss,
        max_length=config.max_length,
        packing=config.packing,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(data.rows),
        processing_class=tokenizer,
        peft_config=config.peft_config(),
    )
    return trainer, model, tokenizer


def train_sft(config: SFTTrainConfig, dataset: Any, store: Any = None) -> CheckpointInfo:
    """Run SFT and write a checkpoint to config.out_dir; register it in `store` when given.

    dataset: TrainingData (from load_training_data("sft", ...)), a datasets.Dataset, a list of
        {"messages", "tools"} rows, or a path to an exported SFT set.
    """
    data = as_training_data("sft", dataset)
    trainer, model, tokenizer = build_sft_trainer(config, data)
    parent = parent_model_id(config.init, model)
    output = trainer.train()
    metrics = train_metrics(output, trainer, rows=len(data))
    info = finish_training(trainer, tokenizer, config, data, kind="sft", parent_id=parent, metrics=metrics, store=store)
    log.info("sft checkpoint %s at %s (loss %.4f)", info.model_id, info.path, metrics["train_loss"])
    return info
