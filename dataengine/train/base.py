"""Settings every trainer shares (model, output, optimiser, LoRA, lengths, seed) and how they
map onto TRL / transformers TrainingArguments."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    """Common training settings; DPOTrainConfig, SFTTrainConfig and GRPOTrainConfig extend it."""

    init: str = field(
        default="smollm2", metadata={"help": "Model to start from: 'smollm2', 'tiny' or a checkpoint folder."}
    )
    out_dir: str = field(default="checkpoints/run", metadata={"help": "Folder the checkpoint is written to."})
    learning_rate: float = field(default=1e-5, metadata={"help": "Peak AdamW learning rate."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the data (ignored if max_steps > 0)."})
    max_steps: int = field(default=-1, metadata={"help": "Optimizer steps; > 0 overrides num_train_epochs."})
    batch_size: int = field(default=2, metadata={"help": "Examples per device per optimizer micro-step."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-steps per optimizer step."})
    warmup_steps: int = field(default=0, metadata={"help": "Steps of linear learning-rate warmup."})
    max_length: int = field(default=1024, metadata={"help": "Longest tokenized sequence; longer ones are truncated."})
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA path."})
    seed: int = field(default=0, metadata={"help": "Seed of data order, dropout and sampling."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in backward (saves memory, costs time)."}
    )
    device: str = field(default="auto", metadata={"help": "'auto' (GPU when present), 'cpu' or 'cuda'."})
    logging_steps: int = field(default=1, metadata={"help": "Log metrics every this many steps."})
    run_id: str | None = field(default=None, metadata={"help": "Run id for the store's models row."})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def model_device(self) -> str:
        """The device the model is loaded on."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def trl_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by DPOConfig, SFTConfig and GRPOConfig."""
        import torch

        use_cpu = self.model_device() == "cpu"
        bf16 = (not use_cpu) and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return dict(
            output_dir=self.out_dir,
            learning_rate=self.learning_rate,
            num_train_epochs=self.num_train_epochs,
            max_steps=self.max_steps,
            per_device_train_batch_size=self.batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            warmup_steps=self.warmup_steps,
            seed=self.seed,
            data_seed=self.seed,
            gradient_checkpointing=self.gradient_checkpointing,
            logging_steps=self.logging_steps,
            # The checkpoint is written once, merged, by save_checkpoint; no intermediate Trainer saves.
            save_strategy="no",
            report_to="none",
            use_cpu=use_cpu,
            bf16=bf16,
            fp16=False,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )

    def peft_config(self) -> Any:
        """A peft LoraConfig when `lora` is on, else None."""
        if not self.lora:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_rank,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )

    def validate(self) -> None:
        """Raise ValueError naming the field when a setting is out of range."""
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_steps == 0 or (self.max_steps < 0 and self.num_train_epochs <= 0):
            raise ValueError("set max_steps > 0 or num_train_epochs > 0: nothing would be trained")
        if self.lora and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")


def train_metrics(train_output: Any, trainer: Any, rows: int) -> dict[str, Any]:
    """The metrics recorded with a checkpoint: final train loss, steps, runtime and the last logs."""
    metrics = dict(getattr(train_output, "metrics", {}) or {})
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    out: dict[str, Any] = {
        "train_loss": float(train_output.training_loss),
        "steps": int(trainer.state.global_step),
        "runtime_s": float(metrics.get("train_runtime", 0.0)),
        "rows": rows,
    }
    if logs:
        out["last_log"] = {k: v for k, v in logs[-1].items() if isinstance(v, (int, float))}
    return out
