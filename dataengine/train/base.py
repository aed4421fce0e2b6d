"""How the settings every trainer shares (dataengine.config.TrainConfig: model, output,
optimiser, LoRA, lengths, seed) map onto TRL / transformers TrainingArguments."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

from dataengine import heap
from dataengine.config import TrainConfig
from dataengine.train.progress import bar_wanted

HISTORY_KEYS = ("loss", "reward", "grad_norm", "learning_rate")
MAX_HISTORY = 500


def model_device(config: TrainConfig) -> str:
    """The device the model is loaded on."""
    import torch

    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device


def trl_kwargs(config: TrainConfig) -> dict[str, Any]:
    """Keyword arguments shared by DPOConfig, SFTConfig and GRPOConfig."""
    import torch

    use_cpu = model_device(config) == "cpu"
    bf16 = (not use_cpu) and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return dict(
        output_dir=config.out_dir,
        learning_rate=config.learning_rate,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        warmup_steps=config.warmup_steps,
        seed=config.seed,
        data_seed=config.seed,
        gradient_checkpointing=config.gradient_checkpointing,
        logging_steps=config.logging_steps,
        # The checkpoint is written once, merged, by save_checkpoint; no intermediate Trainer saves.
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu,
        bf16=bf16,
        fp16=False,
        dataloader_num_workers=0,
        # The step bar on a terminal; elsewhere dataengine.train.progress prints timed lines.
        disable_tqdm=not bar_wanted(),
    )


# Tokens per projection tile of TRL's fused LM head on a device without Triton (CPU).
CPU_LOGPROB_TILE = 256


def fit_fused_head_to_cpu(device: str) -> None:
    """Bound the memory of TRL's fused LM head (every trainer scores tokens through it) on CPU.

    Without Triton, TRL scores every position of the batch, padding and prompt included, in tiles
    of 4,096 tokens x 32,768 vocabulary entries, and each torch op on a tile makes a full-size
    temporary: 4 sequences of 1,024 tokens took ~4.5 GB beside SmolLM2's 135M parameters. On CPU
    we score only the positions with a label (what TRL does on CUDA, same values) in tiles of
    CPU_LOGPROB_TILE tokens. A TRL without these module names is left as it is.
    """
    if device != "cpu":
        return
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    if hasattr(chunked_logprob, "TOKEN_CHUNK_SIZE"):
        chunked_logprob.TOKEN_CHUNK_SIZE = CPU_LOGPROB_TILE
    original = getattr(utils, "_use_triton", None)
    if original is not None and not getattr(original, "dataengine_cpu", False):
        # Decides only whether unlabelled positions are dropped before scoring; the tiles are
        # still folded in torch (chunked_logprob keeps its own device check).
        def compact(dev: Any) -> bool:
            return dev.type == "cpu" or original(dev)

        compact.dataengine_cpu = True  # type: ignore[attr-defined]
        utils._use_triton = compact


def load_for_training(config: TrainConfig) -> tuple[Any, Any]:
    """(model, tokenizer) of config.init on its device, in train mode; on CPU with TRL's fused LM
    head bounded (fit_fused_head_to_cpu) and large blocks freed at once (dataengine.heap)."""
    from dataengine.models import load_model

    device = model_device(config)
    if device == "cpu":
        heap.map_large_blocks()
    model, tokenizer = load_model(config.init, device=device)
    model.train()
    fit_fused_head_to_cpu(device)
    return model, tokenizer


T = TypeVar("T")


def training_heap(train: Callable[..., T]) -> Callable[..., T]:
    """Decorate a trainer `train(config, ...)`: on CPU, load_for_training maps large blocks
    (freed memory goes back at once while training); when the trainer returns or raises, the
    heap serves them again (`heap.serve_from_heap`), because the search and evaluation that
    follow in a pipeline's process allocate and free the same blocks at every decode step."""

    @functools.wraps(train)
    def run(config: TrainConfig, *args: Any, **kwargs: Any) -> T:
        try:
            return train(config, *args, **kwargs)
        finally:
            if model_device(config) == "cpu":
                heap.serve_from_heap()

    return run


def peft_config(config: TrainConfig) -> Any:
    """A peft LoraConfig when `config.lora` is on, else None."""
    if not config.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def log_history(entries: list[dict[str, Any]], max_points: int = MAX_HISTORY) -> dict[str, list[Any]]:
    """The trainer's per-step logs, small: {"step": [int], key: [float | None]} for the
    HISTORY_KEYS that any entry has (None where an entry lacks one), values to 6 significant
    digits, at most `max_points` entries (evenly spaced, the last one kept)."""
    rows = [e for e in entries if "step" in e and any(k in e for k in HISTORY_KEYS)]
    if len(rows) > max_points:
        last = len(rows) - 1
        rows = [rows[round(i * last / (max_points - 1))] for i in range(max_points)]

    def number(value: Any) -> float | None:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(f"{value:.6g}")

    keys = [k for k in HISTORY_KEYS if any(k in e for e in rows)]
    out: dict[str, list[Any]] = {"step": [int(e["step"]) for e in rows]}
    out.update({k: [number(e.get(k)) for e in rows] for k in keys})
    return out


def train_metrics(train_output: Any, trainer: Any, rows: int) -> dict[str, Any]:
    """The metrics recorded with a checkpoint: final train loss, steps, runtime, the last logs
    and `log_history` (see log_history: loss, reward, grad_norm, learning_rate per logged step)."""
    metrics = dict(getattr(train_output, "metrics", {}) or {})
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    out: dict[str, Any] = {
        "train_loss": float(train_output.training_loss),
        "steps": int(trainer.state.global_step),
        "runtime_s": float(metrics.get("train_runtime", 0.0)),
        "rows": rows,
        "log_history": log_history(trainer.state.log_history),
    }
    if logs:
        out["last_log"] = {k: v for k, v in logs[-1].items() if isinstance(v, (int, float))}
    return out
