"""Offline DPO on step-level or trajectory-level preference pairs (TRL DPOTrainer).

Reads preference rows {"prompt", "chosen", "rejected", "tools"} (see dataengine.train.data).
With `behaviour_ref=True` the reference log-probs are not computed by a reference model: they are
the behaviour log-probs the search logged for each side (the rows' "ref_chosen_logps" /
"ref_rejected_logps"), as Agent Q's off-policy DPO does. TRL's DPOTrainer already reads those
columns when `precompute_ref_log_probs=True`; the small subclass below only stops it from
overwriting them with a fresh reference pass.
"""

from __future__ import annotations

import logging
from typing import Any

from dataengine.config import DPOTrainConfig
from dataengine.train.base import model_device, peft_config, train_metrics, trl_kwargs
from dataengine.train.progress import attach_progress
from dataengine.models import weights_fingerprint
from dataengine.train.checkpoint import CheckpointInfo, finish_training, parent_model_id
from dataengine.train.data import TrainingData, as_training_data

log = logging.getLogger(__name__)

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


def _dpo_trainer_class() -> type:
    """DPOTrainer that keeps reference log-probs already present in the dataset."""
    from trl import DPOTrainer

    class BehaviourReferenceDPOTrainer(DPOTrainer):
        """With precompute_ref_log_probs=True and the dataset already holding ref_chosen_logps /
        ref_rejected_logps (the behaviour policy's), use them as they are."""

        def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
            if all(column in dataset.column_names for column in REF_COLUMNS):
                return dataset
            return super()._precompute_ref_logps(dataset, name, batch_size)

    return BehaviourReferenceDPOTrainer


def build_dpo_trainer(config: DPOTrainConfig, data: TrainingData) -> tuple[Any, Any, Any]:
    """(trainer, model, tokenizer) ready to train; exposed so tests can inspect batches."""
    from trl import DPOConfig

    from dataengine.models import load_model

    rows = data.rows
    has_ref = all(all(c in r for c in REF_COLUMNS) for r in rows)
    if config.behaviour_ref and not has_ref:
        raise ValueError(
            "behaviour_ref=True but the pairs carry no ref_chosen_logps/ref_rejected_logps; export pairs with "
            "their behaviour log-probs or turn behaviour_ref off"
        )
    if not config.behaviour_ref:
        # Without the option the reference is a model; stored log-probs would silently take over.
        rows = [{k: v for k, v in r.items() if k not in REF_COLUMNS} for r in rows]
    from datasets import Dataset

    dataset = Dataset.from_list(rows)
    model, tokenizer = load_model(config.init, device=model_device(config))
    model.train()
    args = DPOConfig(
        **trl_kwargs(config),
        beta=config.beta,
        loss_type=[t.strip() for t in config.loss_type.split(",") if t.strip()],
        max_length=config.max_length,
        precompute_ref_log_probs=config.behaviour_ref or config.precompute_ref_log_probs,
    )
    ref_model = None
    if not config.behaviour_ref and not config.lora and not config.precompute_ref_log_probs:
        # The reference is the starting model itself, loaded the same way (same weights, same dtype).
        ref_model, _ = load_model(config.init, device=model_device(config))
    trainer = _dpo_trainer_class()(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config(config),
    )
    attach_progress(trainer, "dpo")
    return trainer, model, tokenizer


def train_dpo(
    config: DPOTrainConfig,
    dataset: Any,
    store: Any = None,
) -> CheckpointInfo:
    """Run DPO and write a checkpoint to config.out_dir; register it in `store` when given.

    dataset: TrainingData (from load_training_data("preference", ...)), a datasets.Dataset,
        a list of preference rows, or a path to exported pairs.
    """
    data = as_training_data("preference", dataset)
    trainer, model, tokenizer = build_dpo_trainer(config, data)
    parent = parent_model_id(config.init, model)
    before = weights_fingerprint(model)
    output = trainer.train()
    metrics = train_metrics(output, trainer, rows=len(data))
    metrics["reference"] = "behaviour" if config.behaviour_ref else ("adapter-off" if config.lora else "model")
    info = finish_training(trainer, tokenizer, config, data, kind="dpo", parent_id=parent, metrics=metrics, store=store,
                           before=before)
    log.info("dpo checkpoint %s at %s (loss %.4f)", info.model_id, info.path, metrics["train_loss"])
    return info
