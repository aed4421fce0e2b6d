"""Saving a trained model as a checkpoint folder and registering it in the store's models table.

A checkpoint folder holds the merged weights (safetensors), the tokenizer with its chat template,
and `dataengine_checkpoint.json` (the CheckpointInfo), so `load_model(path)` loads it and a later
training run finds its parent's id without the store.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "dataengine_checkpoint.json"
MODELS_TABLE = "models"


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a training run produced.

    model_id: "<kind>-<name>@<16 hex of the weight files>" (dataengine.models.checkpoint_hash).
    parent_id: model_id of the model training started from.
    path: the checkpoint folder (load it with dataengine.models.load_model(path)).
    kind: "dpo" | "sft" | "grpo".
    config: the training config as a JSON-able dict.
    dataset_versions: where the training data came from, e.g. {"pairs": 3} (Delta versions of the
        store tables) or {"file:/x.parquet": "<sha256>"} for exported files.
    metrics: training metrics (train_loss, steps, runtime seconds, rows, ...).
    created_at: ISO-8601 UTC time the checkpoint was written.
    """

    model_id: str
    parent_id: str | None
    path: str
    kind: str
    config: dict[str, Any] = field(default_factory=dict)
    dataset_versions: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    def to_row(self, *, run_id: str) -> dict[str, Any]:
        """The row for the store's models table (JSON columns as strings)."""
        return {
            "run_id": run_id,
            "shard_id": self.model_id,
            "model_id": self.model_id,
            "parent_id": self.parent_id,
            "path": self.path,
            "kind": self.kind,
            "config_json": json.dumps(self.config, sort_keys=True, default=str),
            "dataset_versions_json": json.dumps(self.dataset_versions, sort_keys=True, default=str),
            "metrics_json": json.dumps(self.metrics, sort_keys=True, default=str),
            "created_at": datetime.fromisoformat(self.created_at) if self.created_at else None,
        }


def read_checkpoint_info(path: str | Path) -> CheckpointInfo | None:
    """The CheckpointInfo saved in a checkpoint folder, or None when the folder has none."""
    file = Path(path) / CHECKPOINT_FILE
    if not file.is_file():
        return None
    return CheckpointInfo(**json.loads(file.read_text()))


def parent_model_id(init: str, model: Any) -> str:
    """The id of the model training starts from: the checkpoint's own id when `init` is a folder
    we wrote, else dataengine.models.model_id (name@hash of the weight files)."""
    from dataengine.models import is_builtin, model_id

    info = None if is_builtin(init) else read_checkpoint_info(init)
    if info is not None:
        return info.model_id

    return model_id(model)


def save_checkpoint(
    model: Any,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    kind: str,
    parent_id: str | None,
    config: dict[str, Any],
    dataset_versions: dict[str, Any],
    metrics: dict[str, Any],
) -> CheckpointInfo:
    """Merge LoRA adapters (if any), save weights + tokenizer + CheckpointInfo to `out_dir`.

    The merged model is a plain transformers model, so the folder loads with load_model(path)
    and needs no peft at inference.
    """
    from dataengine.models import checkpoint_hash

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    name = Path(str(config.get("init", "model"))).name or "model"
    info = CheckpointInfo(
        model_id=f"{kind}-{name}@{checkpoint_hash(out)}",
        parent_id=parent_id,
        path=str(out.resolve()),
        kind=kind,
        config=config,
        dataset_versions=dataset_versions,
        metrics=metrics,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    (out / CHECKPOINT_FILE).write_text(json.dumps(asdict(info), indent=1, sort_keys=True, default=str))
    return info


QUESTIONS_FILE = "dataengine_trained_questions.json"


def question_key(text: str) -> str:
    """The identity of a task's question for leakage checks: the first user turn, case and
    whitespace folded, hashed."""
    import hashlib

    return hashlib.sha256(" ".join(str(text).split()).lower().encode()).hexdigest()[:24]


def first_user_text(row: dict[str, Any]) -> str | None:
    """The first user turn of a training row (prompt or messages list, or their JSON)."""
    for column in ("prompt", "messages", "prompt_json", "messages_json"):
        messages = row.get(column)
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except ValueError:
                continue
        if isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict) and m.get("role") == "user":
                    return str(m.get("content") or "")
    return None


def trained_questions(model: str | Path) -> set[str]:
    """Question keys a checkpoint (and every checkpoint it was trained from) was trained on;
    empty for a base model ("smollm2", "tiny") or a folder without the file."""
    path = Path(str(model)) / QUESTIONS_FILE
    if not path.is_file():
        return set()
    return set(json.loads(path.read_text()))


def register_checkpoint(
    store: Any,
    info: CheckpointInfo,
    *,
    run_id: str | None = None,
    verifier_versions: dict[str, str] | None = None,
) -> str:
    """Append `info` to the store's models table and the training run's lineage to `runs`
    (config, model, weights hash, seed, source table versions). Both are keyed by the model id,
    so a retried registration never doubles a row. Returns the run id used."""
    run_id = run_id or f"train-{info.kind}-{info.model_id.rsplit('@', 1)[-1]}"
    store.append(MODELS_TABLE, [info.to_row(run_id=run_id)], run_id=run_id, shard_id=info.model_id)
    store.record_run(
        run_id,
        kind=f"train_{info.kind}",
        config=info.config,
        model_id=info.model_id,
        checkpoint_hash=info.model_id.rsplit("@", 1)[-1],
        verifier_versions=verifier_versions,
        seed=info.config.get("seed"),
        source_versions={k: v for k, v in info.dataset_versions.items() if isinstance(v, int)},
        shard_id=info.model_id,
    )
    return run_id


def finish_training(
    trainer: Any,
    tokenizer: Any,
    config: Any,
    data: Any,
    *,
    kind: str,
    parent_id: str | None,
    metrics: dict[str, Any],
    store: Any = None,
    verifier_versions: dict[str, str] | None = None,
    before: str | None = None,
) -> CheckpointInfo:
    """The common end of every trainer: save the checkpoint, register it when a store is given.

    before: `weights_fingerprint` of the model before training (full fine-tuning); the metrics
    get `weights_changed` (False: training did not move a sampled weight, e.g. GRPO whose every
    group had zero reward variance; such a checkpoint is no step forward, and the pipeline does
    not count it as one).
    """
    from dataengine.models import weights_fingerprint

    if before is not None and not config.lora:
        metrics = {**metrics, "weights_changed": weights_fingerprint(trainer.model) != before}
        if not metrics["weights_changed"]:
            log.warning("%s training did not change the weights (grad norm 0 or no usable data)", kind)
    info = save_checkpoint(
        trainer.model,
        tokenizer,
        config.out_dir,
        kind=kind,
        parent_id=parent_id,
        config=config.to_dict(),
        dataset_versions=data.versions,
        metrics=metrics,
    )
    # The lineage's questions: held-out evaluation refuses tasks this checkpoint learned from.
    keys = trained_questions(config.init) | {question_key(t) for t in map(first_user_text, data.rows) if t}
    (Path(config.out_dir) / QUESTIONS_FILE).write_text(json.dumps(sorted(keys)))
    if store is not None:
        register_checkpoint(store, info, run_id=config.run_id, verifier_versions=verifier_versions)
    return info
