"""Rejection-sampling SFT on successful (or recovered) episodes (TRL SFTTrainer).

Reads rows {"messages", "tools"} (see dataengine.train.data). The loss is on assistant tokens only
(SFTConfig(assistant_only_loss=True)): the chat template wraps each assistant turn, with its
<|im_end|>, in {% generation %} markers, so the prompt, the system block with the tool list and
every <tool_response> get label -100 and are never trained on.
"""

from __future__ import annotations

import logging
from typing import Any

from dataengine.config import SFTTrainConfig
from dataengine.models import weights_fingerprint
from dataengine.train.base import load_for_training, peft_config, train_metrics, training_heap, trl_kwargs
from dataengine.train.checkpoint import CheckpointInfo, finish_training, parent_model_id
from dataengine.train.data import TrainingData, as_training_data
from dataengine.train.progress import attach_progress

log = logging.getLogger(__name__)


def build_sft_trainer(config: SFTTrainConfig, data: TrainingData) -> tuple[Any, Any, Any]:
    """(trainer, model, tokenizer) ready to train; trainer.train_dataset holds input_ids and
    labels (-100 off the assistant turns), which tests inspect."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer


    model, tokenizer = load_for_training(config)
    args = SFTConfig(
        **trl_kwargs(config),
        assistant_only_loss=config.assistant_only_loss,
        max_length=config.max_length,
        packing=config.packing,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(data.rows),
        processing_class=tokenizer,
        peft_config=peft_config(config),
    )
    attach_progress(trainer, "sft")
    return trainer, model, tokenizer


@training_heap
def train_sft(config: SFTTrainConfig, dataset: Any, store: Any = None) -> CheckpointInfo:
    """Run SFT and write a checkpoint to config.out_dir; register it in `store` when given.

    dataset: TrainingData (from load_training_data("sft", ...)), a datasets.Dataset, a list of
        {"messages", "tools"} rows, or a path to an exported SFT set.
    """
    data = as_training_data("sft", dataset)
    trainer, model, tokenizer = build_sft_trainer(config, data)
    parent = parent_model_id(config.init, model)
    before = weights_fingerprint(model)
    output = trainer.train()
    metrics = train_metrics(output, trainer, rows=len(data))
    info = finish_training(trainer, tokenizer, config, data, kind="sft", parent_id=parent, metrics=metrics, store=store,
                           before=before)
    log.info("sft checkpoint %s at %s (loss %.4f)", info.model_id, info.path, metrics["train_loss"])
    return info
