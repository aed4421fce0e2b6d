"""Offline DPO on step-level or trajectory-level preference pairs (TRL DPOTrainer).

Reads preference rows {"prompt", "chosen", "rejected", "tools"} (see dataengine.train.data).
With `behaviour_ref=True` no reference model is kept during training: before the trainer is
built, the behaviour model (the policy that sampled the pairs, Agent Q's off-policy reference)
scores each side on exactly the tokens TRL's DPOTrainer will score (dataengine.train.reference),
and the rows carry the results as "ref_chosen_logps" / "ref_rejected_logps". TRL reads those
columns when `precompute_ref_log_probs=True`; the small subclass below only stops it from
overwriting them with a pass of the policy itself. Log-probs logged during search (the rows'
own ref columns, if any) are replaced: they cover the sampled tokens only, not TRL's completion.
"""

from __future__ import annotations

import logging
from typing import Any

from dataengine.config import DPOTrainConfig
from dataengine.models import weights_fingerprint
from dataengine.train.base import load_for_training, model_device, peft_config, train_metrics, training_heap, trl_kwargs
from dataengine.train.checkpoint import CheckpointInfo, finish_training, parent_model_id
from dataengine.train.data import TrainingData, as_training_data
from dataengine.train.progress import attach_progress
from dataengine.train.reference import (
    REF_COLUMNS,
    BehaviourModelError,
    behaviour_reference_logps,
    recorded_behaviour_model,
)

log = logging.getLogger(__name__)

__all__ = ["BehaviourModelError", "behaviour_reference_logps", "build_dpo_trainer", "train_dpo"]


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


def behaviour_model(config: DPOTrainConfig, data: TrainingData, store: Any = None) -> tuple[str, str]:
    """(model id or name, local name or folder) of the model that sampled the pairs:
    config.behaviour_model when set, else the one `store` records for the pairs' runs."""
    if config.behaviour_model:
        return config.behaviour_model, config.behaviour_model
    if store is None:
        raise BehaviourModelError(
            "behaviour_ref=True needs the model that sampled the pairs: train from the store that holds them "
            "(its nodes/trajectories record it) or set behaviour_model"
        )
    return recorded_behaviour_model(store, data.versions)


def build_dpo_trainer(config: DPOTrainConfig, data: TrainingData, store: Any = None) -> tuple[Any, Any, Any]:
    """(trainer, model, tokenizer) ready to train; exposed so tests can inspect batches.

    store: with behaviour_ref, where the pairs' behaviour model is recorded (see behaviour_model).
    """
    from trl import DPOConfig

    from dataengine.models import load_model

    # Stored ref columns are never the reference: behaviour_ref recomputes them, a model reference ignores them.
    rows = [{k: v for k, v in r.items() if k not in REF_COLUMNS} for r in data.rows]
    from datasets import Dataset

    model, tokenizer = load_for_training(config)
    args = DPOConfig(
        **trl_kwargs(config),
        beta=config.beta,
        loss_type=[t.strip() for t in config.loss_type.split(",") if t.strip()],
        max_length=config.max_length,
        precompute_ref_log_probs=config.behaviour_ref or config.precompute_ref_log_probs,
    )
    if config.behaviour_ref:
        ident, local = behaviour_model(config, data, store)
        log.info("behaviour reference: scoring %d pairs with %s (%s)", len(rows), ident, local)
        refs = behaviour_reference_logps(
            local, rows, tokenizer=tokenizer, max_length=args.max_length, truncation_mode=args.truncation_mode,
            batch_size=args.precompute_ref_batch_size or args.per_device_train_batch_size,
            device=model_device(config), bf16=args.bf16,
        )
        rows = [{**r, REF_COLUMNS[0]: c, REF_COLUMNS[1]: j} for r, (c, j) in zip(rows, refs)]
    dataset = Dataset.from_list(rows)
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
    trainer.behaviour_model = ident if config.behaviour_ref else None
    attach_progress(trainer, "dpo")
    return trainer, model, tokenizer


@training_heap
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
    trainer, model, tokenizer = build_dpo_trainer(config, data, store=store)
    parent = parent_model_id(config.init, model)
    before = weights_fingerprint(model)
    output = trainer.train()
    metrics = train_metrics(output, trainer, rows=len(data))
    metrics["reference"] = "behaviour" if config.behaviour_ref else ("adapter-off" if config.lora else "model")
    if config.behaviour_ref:
        metrics["behaviour_model"] = trainer.behaviour_model
    info = finish_training(trainer, tokenizer, config, data, kind="dpo", parent_id=parent, metrics=metrics, store=store,
                           before=before)
    log.info("dpo checkpoint %s at %s (loss %.4f)", info.model_id, info.path, metrics["train_loss"])
    return info
