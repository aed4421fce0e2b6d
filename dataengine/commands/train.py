"""`dataengine train dpo|sft|grpo|chain`: train from exported datasets or the store's tables.

Each command starts from --init (a checkpoint folder, 'smollm2' or 'tiny'), writes a checkpoint
folder to --out and, with --store, registers it in the models table with its parent and the
dataset versions it read. `chain` runs DPO -> (SFT) -> GRPO, each stage from the previous one's
checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

train_app = typer.Typer(help="Train with TRL: offline DPO, rejection-sampling SFT, online GRPO with tools.",
                        no_args_is_help=True)

_STORE = typer.Option(None, "--store", help="Store root: read pairs/sft/replay from it and register the checkpoint.")
_DATA = typer.Option(None, "--data", help="Exported dataset (.parquet, .jsonl, or an HF folder); default: the store.")
_INIT = typer.Option("smollm2", "--init", help="Model to start from: 'smollm2', 'tiny' or a checkpoint folder.")
_OUT = typer.Option(..., "--out", help="Checkpoint folder to write.")
_STEPS = typer.Option(-1, "--steps", help="Optimizer steps (> 0 overrides --epochs).")
_EPOCHS = typer.Option(1.0, "--epochs", help="Passes over the data.")
_BATCH = typer.Option(None, "--batch-size", help="Examples (GRPO: completions) per micro-step.")
_LORA = typer.Option(False, "--lora/--no-lora", help="Train LoRA adapters (merged into the checkpoint).")
_RANK = typer.Option(16, "--lora-rank", help="LoRA rank.")
_SEED = typer.Option(0, "--seed", help="Seed of data order and sampling.")
_MAXLEN = typer.Option(1024, "--max-length", help="Longest tokenized training sequence.")
_LIMIT = typer.Option(None, "--limit", help="Use at most this many rows.")
_DEVICE = typer.Option("auto", "--device", help="auto, cpu or cuda.")
_RUN = typer.Option(None, "--run-id", help="Run id of the models row.")
_FROM_RUN = typer.Option(None, "--run", help="Store only: train on rows of this run (repeat for several).")
_SUITE = typer.Option(None, "--suite", help="Store only: train on rows of this suite (repeat for several).")


def _open_store(path: Path | None) -> Any:
    if path is None:
        return None
    from storage import Store, StoreError

    try:
        return Store(path, create=False)
    except StoreError as exc:
        raise typer.BadParameter(str(exc), param_hint="--store") from None


def _common(init: str, out: Path, steps: int, epochs: float, batch: int | None, lora: bool, rank: int,
            seed: int, max_length: int, device: str, run_id: str | None, lr: float | None) -> dict[str, Any]:
    values: dict[str, Any] = dict(init=init, out_dir=str(out), max_steps=steps, num_train_epochs=epochs, lora=lora,
                                  lora_rank=rank, seed=seed, max_length=max_length, device=device, run_id=run_id)
    if batch is not None:
        values["batch_size"] = batch
    if lr is not None:
        values["learning_rate"] = lr
    return values


def _load(kind: str, data: Path | None, store: Any, **filters: Any) -> Any:
    from dataengine.train.data import TrainingDataError, load_training_data

    if data is None and store is None:
        raise typer.BadParameter("give --data (an exported dataset) or --store (read the store's tables)")
    try:
        return load_training_data(kind, data, store=None if data is not None else store, **filters)
    except TrainingDataError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _config(cls: Any, **values: Any) -> Any:
    """A validated trainer config; a bad value is a one-line error naming the field."""
    from pydantic import ValidationError

    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise typer.BadParameter(f"{'.'.join(str(p) for p in err['loc']) or cls.__name__}: {err['msg']}") from None


def _train(kind: str, config: Any, rows: Any, store: Any) -> None:
    from dataengine.stages.train import train_checkpoint

    info, resumed = train_checkpoint(kind, config, rows, store=store)
    if resumed:
        typer.echo(f"{config.out_dir} already holds a {info.kind} checkpoint; not trained again")
    _report(info)


def _report(info: Any) -> None:
    summary = {
        "model_id": info.model_id,
        "parent_id": info.parent_id,
        "path": info.path,
        "kind": info.kind,
        "dataset_versions": info.dataset_versions,
        "metrics": {k: v for k, v in info.metrics.items() if not isinstance(v, dict)},
    }
    typer.echo(json.dumps(summary, indent=1, sort_keys=True))


@train_app.command("dpo")
def dpo_command(
    store: Path | None = _STORE, data: Path | None = _DATA, init: str = _INIT, out: Path = _OUT,
    steps: int = _STEPS, epochs: float = _EPOCHS, batch_size: int | None = _BATCH,
    lr: float | None = typer.Option(None, "--lr", help="Learning rate (default 5e-6)."),
    beta: float = typer.Option(0.1, "--beta", help="DPO beta (KL strength)."),
    loss_type: str = typer.Option("sigmoid", "--loss-type", help="TRL DPO loss(es), comma-separated."),
    behaviour_ref: bool = typer.Option(False, "--behaviour-ref/--model-ref",
                                       help="Reference = the behaviour model (the one that sampled the pairs) scoring "
                                            "TRL's completion tokens once, before training (Agent Q; no reference model "
                                            "held while training)."),
    behaviour_model: str | None = typer.Option(None, "--behaviour-model",
                                                  help="With --behaviour-ref: the model that sampled the pairs "
                                                       "(default: the one the store records for them)."),
    pair_kind: str | None = typer.Option(None, "--pair-kind", help="Store only: step or trajectory pairs."),
    min_margin: float | None = typer.Option(None, "--min-margin", help="Store only: pairs with margin >= this."),
    lora: bool = _LORA, lora_rank: int = _RANK, seed: int = _SEED, max_length: int = _MAXLEN,
    limit: int | None = _LIMIT, device: str = _DEVICE, run_id: str | None = _RUN,
    run: list[str] | None = _FROM_RUN, suite: list[str] | None = _SUITE,
) -> None:
    """Offline DPO on step and/or trajectory preference pairs."""
    from dataengine.config import DPOTrainConfig

    st = _open_store(store)
    rows = _load("preference", data, st, pair_kind=pair_kind, min_margin=min_margin, behaviour_ref=behaviour_ref,
                 run_ids=run, suites=suite,
                 limit=limit)
    config = _config(DPOTrainConfig, **_common(init, out, steps, epochs, batch_size, lora, lora_rank, seed, max_length,
                                               device, run_id, lr), beta=beta, loss_type=loss_type,
                     behaviour_ref=behaviour_ref, behaviour_model=behaviour_model)
    _train("dpo", config, rows, st)


@train_app.command("sft")
def sft_command(
    store: Path | None = _STORE, data: Path | None = _DATA, init: str = _INIT, out: Path = _OUT,
    steps: int = _STEPS, epochs: float = _EPOCHS, batch_size: int | None = _BATCH,
    lr: float | None = typer.Option(None, "--lr", help="Learning rate (default 2e-5)."),
    lora: bool = _LORA, lora_rank: int = _RANK, seed: int = _SEED, max_length: int = _MAXLEN,
    limit: int | None = _LIMIT, device: str = _DEVICE, run_id: str | None = _RUN,
    run: list[str] | None = _FROM_RUN, suite: list[str] | None = _SUITE,
) -> None:
    """Rejection-sampling SFT with the loss on assistant tokens only."""
    from dataengine.config import SFTTrainConfig

    st = _open_store(store)
    rows = _load("sft", data, st, limit=limit, run_ids=run, suites=suite)
    config = _config(SFTTrainConfig, **_common(init, out, steps, epochs, batch_size, lora, lora_rank, seed, max_length,
                                               device, run_id, lr))
    _train("sft", config, rows, st)


@train_app.command("grpo")
def grpo_command(
    store: Path | None = _STORE, data: Path | None = _DATA, init: str = _INIT, out: Path = _OUT,
    steps: int = _STEPS, epochs: float = _EPOCHS, batch_size: int | None = _BATCH,
    lr: float | None = typer.Option(None, "--lr", help="Learning rate (default 1e-6)."),
    num_generations: int = typer.Option(4, "--num-generations", help="Rollouts per prompt (group size)."),
    max_completion_length: int = typer.Option(128, "--max-completion-length", help="Token budget per rollout."),
    max_tool_calls: int = typer.Option(4, "--max-tool-calls", help="Tool-calling rounds per rollout."),
    beta: float = typer.Option(0.0, "--beta", help="KL penalty to the starting model."),
    drop_zero_variance: bool = typer.Option(True, "--drop-zero-variance/--keep-zero-variance",
                                            help="Store only: skip prompts with p_success 0 or 1."),
    lora: bool = _LORA, lora_rank: int = _RANK, seed: int = _SEED, max_length: int = _MAXLEN,
    limit: int | None = _LIMIT, device: str = _DEVICE, run_id: str | None = _RUN,
    run: list[str] | None = _FROM_RUN, suite: list[str] | None = _SUITE,
) -> None:
    """Online GRPO: rollouts call tools through the sandboxed ToolEnv, rewards from the verifiers."""
    from dataengine.config import GRPOTrainConfig

    st = _open_store(store)
    rows = _load("prompt", data, st, drop_zero_variance=drop_zero_variance and data is None, limit=limit,
                 run_ids=run, suites=suite)
    values = _common(init, out, steps, epochs, batch_size, lora, lora_rank, seed, max_length, device, run_id, lr)
    values.setdefault("batch_size", num_generations)
    config = _config(GRPOTrainConfig, **values, num_generations=num_generations,
                     max_completion_length=max_completion_length, max_tool_calls=max_tool_calls, beta=beta)
    _train("grpo", config, rows, st)


@train_app.command("chain")
def chain_command(
    store: Path = typer.Option(..., "--store", help="Store root with pairs, sft and replay tables."),
    init: str = _INIT,
    out: Path = typer.Option(..., "--out", help="Folder; each stage writes <out>/<stage>."),
    stages: str = typer.Option("dpo,grpo", "--stages", help="Comma-separated stages in order: dpo, sft, grpo."),
    steps: int = typer.Option(2, "--steps", help="Optimizer steps per stage."),
    behaviour_ref: bool = typer.Option(False, "--behaviour-ref/--model-ref", help="DPO reference option."),
    lora: bool = _LORA, seed: int = _SEED, limit: int | None = _LIMIT, device: str = _DEVICE,
    num_generations: int = typer.Option(4, "--num-generations", help="GRPO group size."),
    max_completion_length: int = typer.Option(128, "--max-completion-length", help="GRPO token budget per rollout."),
) -> None:
    """Offline DPO, then (optionally) SFT, then online GRPO, each from the previous checkpoint."""
    from dataengine.config import DPOTrainConfig, GRPOTrainConfig, SFTTrainConfig
    from dataengine.train.chain import train_chain
    from dataengine.train.data import TrainingDataError

    order = [s.strip() for s in stages.split(",") if s.strip()]
    if not order or any(s not in ("dpo", "sft", "grpo") for s in order):
        raise typer.BadParameter(f"--stages takes dpo, sft, grpo (comma-separated); got {stages!r}")
    common = dict(max_steps=steps, lora=lora, seed=seed, device=device)
    try:
        infos = train_chain(
            _open_store(store), init=init, out_dir=out, stages=order,
            dpo=_config(DPOTrainConfig, **common, behaviour_ref=behaviour_ref), sft=_config(SFTTrainConfig, **common),
            grpo=_config(GRPOTrainConfig, **common, batch_size=num_generations, num_generations=num_generations,
                         max_completion_length=max_completion_length),
            limit=limit,
        )
    except TrainingDataError as exc:
        raise typer.BadParameter(str(exc)) from exc
    for info in infos:
        _report(info)


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")


@train_app.command("value")
def value_command(
    store: Path = typer.Option(..., "--store", help="Store root holding the runs' nodes and tasks."),
    run: list[str] = typer.Option(..., "--run", help="Generate run id whose searched nodes to fit on (repeat for several)."),
    model: str = typer.Option(..., "--model", help="Policy the head is for: 'smollm2', 'tiny' or a checkpoint folder."),
    out: Path = typer.Option(..., "--out", help="Value head file to write (e.g. value.pt)."),
    l2: float = typer.Option(1.0, "--l2", min=0.0, help="Ridge penalty."),
    min_visits: int = typer.Option(2, "--min-visits", min=1,
                                  help="Fit on nodes visited at least this often (1 also takes leaves valued once: the estimate itself)."),
    batch_tokens: int = typer.Option(8192, "--batch-tokens", min=1, help="Padded tokens per feature forward pass."),
    device: str = _DEVICE,
) -> None:
    """Fit a value head (ridge on the policy's last hidden state) on the backed-up values of the
    runs' non-terminal nodes; use it with `dataengine generate --value value_model --value-model OUT`."""
    from dataengine.policy import policy_from_config
    from dataengine.values import fit_value_head, run_policy_config

    st = _open_store(store)
    try:
        policy = policy_from_config(run_policy_config(st, run, model, device))
        summary = fit_value_head(st, run, policy, out, l2=l2, min_visits=min_visits, max_batch_tokens=batch_tokens)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(json.dumps(summary, indent=1, sort_keys=True))
