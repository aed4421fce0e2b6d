"""Small engine configs the tests share (tiny model, CPU, a few simulations)."""

from __future__ import annotations

from typing import Any

from dataengine.config import EngineConfig, load_config


def tiny_engine_config(store: Any, **overrides: Any) -> EngineConfig:
    """An EngineConfig for the tiny model searching with leaf value zero; `overrides` are dotted
    load_config overrides (search__num_simulations=6, ...)."""
    base = {
        "store": str(store),
        "shard_size": 2,
        "policy__model": "tiny",
        "policy__device": "cpu",
        "policy__max_new_tokens": 4,
        "search__num_simulations": 3,
        "search__num_actions": 2,
        "search__value": "zero",
        "search__trees_per_batch": 2,
        "search__max_generated_tokens": 10_000,
    }
    base.update(overrides)
    return load_config(None, **base)
