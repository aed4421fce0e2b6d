"""The train_dpo, train_sft and train_grpo flows: one TRL training run each, holding the
accelerator slot, from an exported dataset file. Thin: the work is dataengine.train.

A finished checkpoint folder (with its dataengine_checkpoint.json) is not trained again: the
flow returns it (and registers it in the store if needed), so a rerun of a pipeline resumes.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from dataengine.config import Section
from flows.runtime import accelerator_slot, artifact_key, ensure_accelerator_limit

Trainer = Literal["dpo", "sft", "grpo"]
# trainer -> (dataset format, export/table it reads)
DATASET = {"dpo": ("preference", "pairs"), "sft": ("sft", "sft"), "grpo": ("prompt", "replay")}


class TrainSettings(Section):
    """Training settings the pipeline passes to every trainer (None: the trainer's default).

    `extra` holds trainer-specific fields of DPOTrainConfig / SFTTrainConfig / GRPOTrainConfig
    (e.g. {"beta": 0.2} or {"num_generations": 4}); an unknown name is an error.
    """

    max_steps: int = Field(8, description="optimizer steps per trainer (> 0), or -1 for epochs")
    num_train_epochs: float = Field(1.0, gt=0, description="passes over the data when max_steps is -1")
    learning_rate: float | None = Field(None, gt=0, description="peak learning rate (None: trainer default)")
    batch_size: int | None = Field(None, ge=1, description="examples per micro-step (None: trainer default)")
    # The tool schemas and worked examples in the system turn take ~600 tokens of every prompt.
    max_length: int = Field(1024, ge=32, description="longest tokenized training sequence")
    lora: bool = Field(False, description="train LoRA adapters (merged into the checkpoint)")
    lora_rank: int = Field(16, ge=1, description="LoRA rank")
    behaviour_ref: bool = Field(False, description="DPO: behaviour log-probs from the tree as the reference")
    device: str = Field("auto", description="auto, cpu or cuda")
    seed: int = Field(0, description="seed of data order and sampling")
    extra: dict[str, dict[str, Any]] = Field(default_factory=dict, description="trainer -> {field: value}")


def trainer_config(kind: str, settings: TrainSettings, *, init: str, out_dir: str, run_id: str | None) -> Any:
    """The dataengine.train config dataclass of `kind` from `settings`."""
    from dataengine.train import DPOTrainConfig, GRPOTrainConfig, SFTTrainConfig

    cls = {"dpo": DPOTrainConfig, "sft": SFTTrainConfig, "grpo": GRPOTrainConfig}[kind]
    values: dict[str, Any] = {
        "init": init, "out_dir": out_dir, "run_id": run_id, "max_steps": settings.max_steps,
        "num_train_epochs": settings.num_train_epochs, "max_length": settings.max_length, "lora": settings.lora,
        "lora_rank": settings.lora_rank, "device": settings.device, "seed": settings.seed,
    }
    if settings.learning_rate is not None:
        values["learning_rate"] = settings.learning_rate
    if settings.batch_size is not None:
        values["batch_size"] = settings.batch_size
    if kind == "dpo":
        values["behaviour_ref"] = settings.behaviour_ref
    extra = settings.extra.get(kind, {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"train.extra.{kind}: unknown field(s) {', '.join(unknown)}; {cls.__name__} has {', '.join(sorted(known))}")
    values.update(extra)
    config = cls(**values)
    config.validate()
    return config


def train_work(kind: str, data: str, settings: TrainSettings, *, init: str, out_dir: str, store: str | None,
               run_id: str | None) -> dict[str, Any]:
    """Train `kind` on the exported dataset `data` from `init` into `out_dir`; register the
    checkpoint in `store`. An existing checkpoint in `out_dir` is returned as it is (resume).
    Returns the CheckpointInfo as a dict plus `resumed`."""
    from dataclasses import asdict

    from dataengine.train import (
        load_training_data,
        read_checkpoint_info,
        register_checkpoint,
        train_dpo,
        train_grpo,
        train_sft,
    )
    from storage import Store

    if kind not in DATASET:
        raise ValueError(f"unknown trainer {kind!r}; choose dpo, sft or grpo")
    target = Store(store) if store else None
    info = read_checkpoint_info(out_dir)
    if info is not None:
        if target is not None and info.model_id not in _registered(target):
            register_checkpoint(target, info, run_id=run_id)
        return {**asdict(info), "resumed": True}
    config = trainer_config(kind, settings, init=init, out_dir=out_dir, run_id=run_id)
    dataset = load_training_data(DATASET[kind][0], data, behaviour_ref=kind == "dpo" and settings.behaviour_ref)
    run = {"dpo": train_dpo, "sft": train_sft, "grpo": train_grpo}[kind]
    with accelerator_slot():
        info = run(config, dataset, store=target)
    return {**asdict(info), "resumed": False}


def _registered(store: Any) -> set[str]:
    if not store.has_table("models"):
        return set()
    return set(store.models().select("model_id").collect()["model_id"].to_list())


@task(name="train", task_run_name="train {kind} from {init}", tags=["dataengine", "accelerator"])
def train_task(kind: str, data: str, settings: TrainSettings, init: str, out_dir: str, store: str | None,
               run_id: str | None) -> dict[str, Any]:
    return train_work(kind, data, settings, init=init, out_dir=out_dir, store=store, run_id=run_id)


def checkpoint_markdown(info: dict[str, Any]) -> str:
    metrics = {k: v for k, v in info.get("metrics", {}).items() if not isinstance(v, dict)}
    lines = [f"# {info['kind']} checkpoint `{info['model_id']}`", "", f"- parent: `{info['parent_id']}`",
             f"- path: `{info['path']}`", f"- datasets: `{info['dataset_versions']}`",
             f"- resumed (already trained): {info.get('resumed', False)}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(metrics.items())]
    return "\n".join(lines)


def _train_flow(kind: str):
    @flow(name=f"train_{kind}", log_prints=False)
    def train_flow(
        data: str,
        init: str = "smollm2",
        out_dir: str = f"runs/checkpoints/{kind}",
        store: str | None = "runs/store",
        run_id: str | None = None,
        settings: TrainSettings | None = None,
        accelerator_slots: int = 1,
    ) -> dict[str, Any]:
        settings = settings or TrainSettings()
        if not Path(data).exists():
            raise ValueError(f"dataset {data} does not exist; export it first (dataengine store export or the export flow)")
        ensure_accelerator_limit(accelerator_slots)
        info = train_task(kind, data, settings, init, out_dir, store, run_id)
        create_markdown_artifact(key=artifact_key("train", kind, Path(out_dir).name), markdown=checkpoint_markdown(info))
        return info

    train_flow.__doc__ = f"Train {kind.upper()} (TRL) on an exported {DATASET[kind][1]} dataset; returns the checkpoint info."
    return train_flow


train_dpo_flow = _train_flow("dpo")
train_sft_flow = _train_flow("sft")
train_grpo_flow = _train_flow("grpo")
