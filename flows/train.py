"""The train_dpo, train_sft and train_grpo flows: one TRL training run each, holding the
accelerator slot, from an exported dataset file. Thin: the work is the train stage
(dataengine.stages.train.train_checkpoint), which also resumes: a finished checkpoint folder is
returned (and registered if needed), not trained again.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import TrainConfig
from flows.runtime import accelerator_slot, artifact_key, ensure_accelerator_limit


@task(name="train", task_run_name="train {kind} from {config.init}", tags=["dataengine", "accelerator"])
def train_task(kind: str, data: str, config: TrainConfig, store: str | None) -> dict[str, Any]:
    from dataengine.stages.resources import open_store
    from dataengine.stages.train import train_checkpoint

    with accelerator_slot():
        info, resumed = train_checkpoint(kind, config, data, store=open_store(store) if store else None)
    return {**asdict(info), "resumed": resumed}


def checkpoint_markdown(info: dict[str, Any]) -> str:
    metrics = {k: v for k, v in info.get("metrics", {}).items() if not isinstance(v, dict)}
    lines = [f"# {info['kind']} checkpoint `{info['model_id']}`", "", f"- parent: `{info['parent_id']}`",
             f"- path: `{info['path']}`", f"- datasets: `{info['dataset_versions']}`",
             f"- resumed (already trained): {info.get('resumed', False)}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(metrics.items())]
    return "\n".join(lines)


def _train_flow(kind: str):
    from dataengine.stages.train import DATASET

    @flow(name=f"train_{kind}", log_prints=False)
    def train_flow(data: str, config: TrainConfig, store: str | None = "runs/store",
                   accelerator_slots: int = 1) -> dict[str, Any]:
        if not Path(data).exists():
            raise ValueError(f"dataset {data} does not exist; export it first (dataengine export or the export flow)")
        ensure_accelerator_limit(accelerator_slots)
        info = train_task(kind, data, config, store)
        create_markdown_artifact(key=artifact_key("train", kind, Path(config.out_dir).name),
                                 markdown=checkpoint_markdown(info))
        return info

    train_flow.__doc__ = (f"Train {kind.upper()} (TRL) with `config` (a {kind} section of the train config: init, "
                          f"out_dir, run_id, ...) on an exported {DATASET[kind][1]} dataset; returns the checkpoint info.")
    return train_flow


train_dpo_flow = _train_flow("dpo")
train_sft_flow = _train_flow("sft")
train_grpo_flow = _train_flow("grpo")
