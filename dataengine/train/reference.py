"""The reference log-probs of behaviour-reference DPO, equal to the ones TRL compares against.

TRL's DPOTrainer scores, for each side of a pair, the tokens of the chat template of
prompt + side that follow the tokenised prompt (end-of-turn tokens and, for trajectory pairs,
tool turns included), truncated to max_length. The log-probs the search logged cover only the
sampled action tokens, so they are not that quantity. `behaviour_reference_logps` tokenises the
rows with TRL's own preprocessing (DPOTrainer._prepare_dataset) and collator, and scores them with
the behaviour model (the policy that sampled the pairs) through TRL's fused log-prob head, the
computation of DPOTrainer.compute_ref_log_probs.

`recorded_behaviour_model` finds that model from the store: the pairs' runs, the source runs of
their derivation, and the `model_id` the nodes / trajectories of those runs record; the id is then
matched, by weight hash, to a local model ("smollm2", "tiny" or a checkpoint in the `models` table).
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)

REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


class BehaviourModelError(ValueError):
    """The behaviour model of the pairs is unknown, ambiguous or not available locally."""


def trl_tokenized(rows: list[dict[str, Any]], tokenizer: Any) -> Any:
    """The rows as TRL's DPOTrainer tokenises them: a datasets.Dataset with the rows' columns plus
    prompt_ids, chosen_ids, rejected_ids (lists of int).

    rows: preference rows in trainer form (dataengine.train.data), in the trainer's order.
    TRL's length filter is left out (max_length=None here), so row i stays row i; the collator
    applies max_length, and a row whose prompt fills it scores 0 (TRL drops such rows).
    """
    from datasets import Dataset
    from trl import DPOTrainer

    dataset = Dataset.from_list([{k: v for k, v in r.items() if k not in REF_COLUMNS} for r in rows])
    # TRL's own preprocessing: it reads only `_tokenizer` from the trainer (for non-chat rows)
    # and these settings from its config, so the spans are exactly the trainer's.
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    trainer = SimpleNamespace(_tokenizer=tokenizer)
    return DPOTrainer._prepare_dataset(trainer, dataset, tokenizer, args, "behaviour reference")


def completion_logps(
    model: Any,
    dataset: Any,
    *,
    pad_token_id: int,
    max_length: int | None = None,
    truncation_mode: str = "keep_start",
    batch_size: int = 4,
    bf16: bool = False,
) -> list[tuple[float, float]]:
    """(chosen, rejected) summed log-probs of the completion spans of a `trl_tokenized` dataset
    under `model`, batched with TRL's DataCollatorForPreference (right padding, per-sequence
    truncation to max_length) and scored with TRL's fused LM head, as compute_ref_log_probs does.

    The model's forward is patched (trl add_fused_lm_head): pass a model loaded for this.
    bf16: run under bfloat16 autocast, as the trainer does on a bf16 GPU.
    """
    import torch
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model)
    collator = DataCollatorForPreference(pad_token_id=pad_token_id, max_length=max_length,
                                         truncation_mode=truncation_mode)
    device = next(model.parameters()).device
    ids = dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])
    out: list[tuple[float, float]] = []
    for start in range(0, len(ids), batch_size):
        batch = collator([ids[i] for i in range(start, min(start + batch_size, len(ids)))])
        input_ids = batch["input_ids"].to(device)
        labels = input_ids.masked_fill(batch["completion_mask"].to(device) == 0, -100)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            scored = model(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device), labels=labels,
                           use_cache=False, fused_lm_head=True)
        chosen, rejected = scored.log_probs.sum(dim=1).float().cpu().chunk(2)
        out.extend(zip(chosen.tolist(), rejected.tolist()))
    return out


def behaviour_reference_logps(
    model_name_or_path: str,
    rows: list[dict[str, Any]],
    *,
    tokenizer: Any = None,
    max_length: int | None = None,
    truncation_mode: str = "keep_start",
    batch_size: int = 4,
    device: str = "cpu",
    bf16: bool = False,
) -> list[tuple[float, float]]:
    """(ref_chosen_logps, ref_rejected_logps) of each row: the completion TRL's DPOTrainer scores,
    under the behaviour model `model_name_or_path` ("smollm2", "tiny" or a checkpoint folder).

    rows: preference rows in trainer form (TrainingData.rows), any ref columns ignored.
    tokenizer: the trained model's tokenizer (TRL tokenises with it); default the behaviour
        model's own. Both must share one vocabulary.
    max_length, truncation_mode, batch_size, bf16: the trainer's DPOConfig settings.
    The model is loaded for this call only (float32 weights on `device`) and freed after.
    """
    import torch

    from dataengine.models import load_model

    try:
        model, own_tokenizer = load_model(model_name_or_path, device=device)
    except FileNotFoundError as exc:
        raise BehaviourModelError(f"behaviour model: {exc}") from None
    tokenizer = tokenizer if tokenizer is not None else own_tokenizer
    if tokenizer.get_vocab() != own_tokenizer.get_vocab():
        raise BehaviourModelError(
            f"behaviour model {model_name_or_path!r} has another vocabulary than the trained model's tokenizer: "
            "its log-probs of the trained model's tokens are no reference"
        )
    try:
        dataset = trl_tokenized(rows, tokenizer)
        return completion_logps(model, dataset, pad_token_id=tokenizer.pad_token_id, max_length=max_length,
                                truncation_mode=truncation_mode, batch_size=batch_size, bf16=bf16)
    finally:
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---- which model sampled the pairs ----------------------------------------------------------


def recorded_behaviour_model(store: Any, versions: dict[str, Any]) -> tuple[str, str]:
    """(model_id, local name or folder) of the policy that sampled the pairs read at
    versions["pairs"] of `store` (the lineage TrainingData.versions carries).

    The pairs' runs lead to their source runs (a `derive/...` runs row's config run_ids; the run
    itself when it has none), whose nodes and trajectories record `model_id` (runs rows of kind
    `generate` when neither table has one). Exactly one model id must come out, and it must be a
    local model with the same weight hash; otherwise BehaviourModelError says what to set.
    """
    import polars as pl

    hint = "set behaviour_model (DPOTrainConfig) to the model that sampled them"
    if "pairs" not in versions:
        raise BehaviourModelError(
            f"the pairs' lineage {sorted(versions)} names no version of a store's pairs table, so no behaviour model "
            f"is recorded for them; {hint}"
        )
    pair_runs = sorted(store.pairs(versions["pairs"]).select("run_id").unique().collect()["run_id"].to_list())
    runs = store.runs().collect() if store.has_table("runs") else None
    sources: set[str] | None = set()
    for run in pair_runs:
        derived = [] if runs is None else runs.filter(
            (pl.col("run_id") == run) & pl.col("kind").str.starts_with("derive/"))["config_json"].to_list()
        named = [json.loads(c or "{}").get("run_ids") for c in derived]
        if not named:
            sources.add(run)  # pairs written straight into the run
        elif all(named):
            sources.update(*named)
        else:
            sources = None  # derived from every run of the store
            break
    ids: set[str] = set()
    for table in ("nodes", "trajectories"):
        if store.has_table(table):
            frame = store.scan(table)
            if sources is not None:
                frame = frame.filter(pl.col("run_id").is_in(sorted(sources)))
            ids.update(frame.select("model_id").unique().collect()["model_id"].drop_nulls().to_list())
    if not ids and runs is not None:
        generated = runs.filter(pl.col("kind") == "generate")
        if sources is not None:
            generated = generated.filter(pl.col("run_id").is_in(sorted(sources)))
        ids.update(generated["model_id"].drop_nulls().to_list())
    where = f"runs {sorted(sources)}" if sources is not None else "every run"
    if not ids:
        raise BehaviourModelError(f"no model_id is recorded in the nodes/trajectories/runs rows of {where} (the pairs' "
                                  f"source); {hint}")
    if len(ids) > 1:
        raise BehaviourModelError(f"the pairs' source ({where}) was sampled by several models {sorted(ids)}; train on "
                                  f"the pairs of one model (filter by run) or {hint}")
    model_id = ids.pop()
    return model_id, local_model(model_id, store)


def local_model(model_id: str, store: Any = None) -> str:
    """The local name or folder whose weights have the hash in `model_id` ("<name>@<hash>"):
    a checkpoint registered under that id in the store's `models` table, or "smollm2" / "tiny"."""
    import polars as pl

    from dataengine.models import SMOLLM2_NAME, TINY_NAME, checkpoint_hash, model_folder

    name, _, digest = model_id.rpartition("@")
    candidates: list[str] = []
    if store is not None and store.has_table("models"):
        rows = store.models().filter(pl.col("model_id") == model_id).collect()
        candidates += [p for p in rows["path"].drop_nulls().to_list()]
    candidates += [short for short, full in (("smollm2", SMOLLM2_NAME), ("tiny", TINY_NAME)) if name in (short, full)]
    for candidate in candidates:
        try:
            folder = model_folder(candidate)
        except FileNotFoundError:
            continue
        if digest and checkpoint_hash(folder) == digest:
            return candidate
    raise BehaviourModelError(
        f"behaviour model {model_id!r} of the pairs is not available locally (looked at {candidates or 'nothing'}: "
        "none exists with that weight hash); set behaviour_model to its folder"
    )
