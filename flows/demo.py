"""The demo flow: best-of-N sampling on the pipeline's round-1 train tasks, then the pipeline.

The best-of-N run (`<run>/best-of-n`) searches the same tasks as round 1's MCTS (same seed,
suites, levels and task count) with the same policy and the same generated-token budget per
task (`search.max_generated_tokens`), so the two runs compare at equal tokens; it runs first,
on the starting model the pipeline's round-0 evaluation loads anyway. Each shard result carries
its own wall time (the search and its commit, not the model's loading).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from dataengine.config import PipelineConfig
from flows.generate import generate_flow
from flows.pipeline import pipeline_flow, round_engine, round_levels, with_model
from flows.runtime import make_task_runner


def best_of_n_run(run_id: str) -> str:
    return f"{run_id}/best-of-n"


@flow(name="demo", flow_run_name="demo {config.run_id}", log_prints=False)
def demo_flow(config: PipelineConfig) -> dict[str, Any]:
    """Best-of-N on round 1's tasks, then `pipeline_flow(config)`; returns the pipeline's result
    with `best_of_n`: the generate flow's {run_id, shards, skipped, store}."""
    rt = config.runtime
    engine = round_engine(config, 1)
    # Round 1's search config (flows.pipeline.pipeline_flow) with the method swapped.
    sampled = with_model(engine, config.engine.policy.model, seed=config.engine.seed).model_copy(update={
        "levels": round_levels(config, 1),
        "generate": engine.generate.model_copy(update={"method": "best_of_n"}),
    })
    baseline = generate_flow.with_options(task_runner=make_task_runner(rt))(
        config=sampled, run_id=best_of_n_run(config.run_id), runtime=rt)
    result = pipeline_flow(config=config)
    return {**result, "best_of_n": baseline}


def run_demo(config: PipelineConfig) -> dict[str, Any]:
    """Run the demo flow (on the embedded ephemeral API unless PREFECT_API_URL is set)."""
    return demo_flow(config=config)
