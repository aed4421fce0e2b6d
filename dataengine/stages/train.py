"""The train stage: one TRL training run (DPO, SFT or GRPO) into a checkpoint folder, registered
in the store with its parent and the dataset versions it read.

A finished checkpoint folder (with its dataengine_checkpoint.json) is not trained again: the
stage returns it (registering it if needed), so a rerun of a pipeline resumes.
"""

from __future__ import annotations

from typing import Any

from dataengine.config import TrainConfig

# trainer -> (dataset format it reads, derived table / export holding it)
DATASET = {"dpo": ("preference", "pairs"), "sft": ("sft", "sft"), "grpo": ("prompt", "replay")}


def registered_models(store: Any) -> set[str]:
    if not store.has_table("models"):
        return set()
    return set(store.models().select("model_id").collect()["model_id"].to_list())


def train_checkpoint(kind: str, config: TrainConfig, data: Any, *, store: Any = None) -> tuple[Any, bool]:
    """Train `kind` with `config` (init, out_dir, run_id, ...) on `data` (an exported dataset
    path, or TrainingData / rows already loaded); register the checkpoint in `store` (a Store or
    None). Returns (CheckpointInfo, resumed): resumed when config.out_dir already held one."""
    from dataengine.train import (
        load_training_data,
        read_checkpoint_info,
        register_checkpoint,
        train_dpo,
        train_grpo,
        train_sft,
    )

    if kind not in DATASET:
        raise ValueError(f"unknown trainer {kind!r}; choose dpo, sft or grpo")
    info = read_checkpoint_info(config.out_dir)
    if info is not None:
        if store is not None and info.model_id not in registered_models(store):
            register_checkpoint(store, info, run_id=config.run_id)
        return info, True
    if isinstance(data, str):
        data = load_training_data(DATASET[kind][0], data, behaviour_ref=kind == "dpo" and config.behaviour_ref)
    run = {"dpo": train_dpo, "sft": train_sft, "grpo": train_grpo}[kind]
    return run(config, data, store=store), False
