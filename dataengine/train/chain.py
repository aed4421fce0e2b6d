"""One training round: offline DPO, then (optionally) rejection-sampling SFT, then online GRPO,
each stage starting from the checkpoint the previous one wrote, all read from and registered in
one store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dataengine.train.checkpoint import CheckpointInfo
from dataengine.train.data import load_training_data
from dataengine.train.dpo import DPOTrainConfig, train_dpo
from dataengine.train.grpo import GRPOTrainConfig, train_grpo
from dataengine.train.sft import SFTTrainConfig, train_sft

STAGES = ("dpo", "sft", "grpo")


def train_chain(
    store: Any,
    *,
    init: str,
    out_dir: str | Path,
    stages: tuple[str, ...] | list[str] = ("dpo", "grpo"),
    dpo: DPOTrainConfig | None = None,
    sft: SFTTrainConfig | None = None,
    grpo: GRPOTrainConfig | None = None,
    pair_kind: str | None = None,
    drop_zero_variance: bool = True,
    limit: int | None = None,
) -> list[CheckpointInfo]:
    """Run `stages` in order; stage k starts from stage k-1's checkpoint (the first from `init`)
    and writes <out_dir>/<stage>. The per-stage configs give every other setting (their `init`
    and `out_dir` are replaced). Returns the CheckpointInfo of each stage, in order."""
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ValueError(f"stages must be a non-empty sequence of {', '.join(STAGES)}; got {list(stages)}")
    infos: list[CheckpointInfo] = []
    current = init
    for stage in stages:
        out = str(Path(out_dir) / stage)
        if stage == "dpo":
            config = (dpo or DPOTrainConfig()).replace(init=current, out_dir=out)
            data = load_training_data("preference", store=store, pair_kind=pair_kind,
                                      behaviour_ref=config.behaviour_ref, limit=limit)
            info = train_dpo(config, data, store=store)
        elif stage == "sft":
            config = (sft or SFTTrainConfig()).replace(init=current, out_dir=out)
            info = train_sft(config, load_training_data("sft", store=store, limit=limit), store=store)
        else:
            config = (grpo or GRPOTrainConfig()).replace(init=current, out_dir=out)
            data = load_training_data("prompt", store=store, drop_zero_variance=drop_zero_variance, limit=limit)
            info = train_grpo(config, data, store=store)
        infos.append(info)
        current = info.path
    return infos
