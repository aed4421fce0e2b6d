"""The generate flow: one Prefect task per shard of a config's tasks.

Thin: the flow is the generate stage's driver (`dataengine.stages.generate.generate`) handed an
executor of Prefect tasks (`prefect_shards`); each task runs the stage's shard function
(`generate_shard_at`: the policy and sandbox its process keeps) holding an accelerator slot. A
rerun with the same run id skips committed shards, so a failed or killed run resumes where it
stopped; `dataengine generate` runs the same driver with the in-process executor, so both write
the same trees and the same lineage row.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import EngineConfig, RuntimeConfig
from dataengine.stages.generate import GenerateExecutor, GeneratePlan, Shard, ShardResult, generate, generate_shard_at
from flows.runtime import (
    accelerator_slot,
    artifact_key,
    ensure_accelerator_limit,
    make_task_runner,
    node_info,
    submit_shards,
)

Method = Literal["mcts", "best_of_n", "greedy"]


@task(name="generate-shard", task_run_name="generate {run_id} shard {index}", tags=["dataengine", "accelerator"])
def generate_shard(config: EngineConfig, run_id: str, index: int) -> ShardResult:
    """The generate stage's shard function (`generate_shard_at`) holding an accelerator slot;
    `node` says where it ran (`node_info`: hostname, pid, Ray node id)."""
    result = generate_shard_at(config, run_id, index, slot=accelerator_slot, log=get_run_logger().info)
    result.node = node_info()
    return result


def prefect_shards(runtime: RuntimeConfig) -> GenerateExecutor:
    """The generate stage's executor on Prefect: one `generate_shard` task per shard."""
    def execute(config: EngineConfig, plan: GeneratePlan, store: Any, todo: list[Shard]) -> list[ShardResult]:
        ensure_accelerator_limit(runtime.accelerator_slots)
        return submit_shards(generate_shard, runtime, [(config, plan.run_id, s.index) for s in todo])

    return execute


def summary_markdown(title: str, run_id: str, store: str, shards: list[dict[str, Any]], skipped: int) -> str:
    """The markdown artifact of a generate run: one row per shard and the totals."""
    done = [s for s in shards if not s.get("skipped")]
    total = {k: sum(s.get(k, 0) for s in done) for k in ("trees", "simulations", "nodes", "trajectories", "successes",
                                                       "solved", "generated_tokens")}
    lines = [f"# {title}: `{run_id}`", "", f"store: `{store}`; shards written {len(done)}, skipped (committed) {skipped}", "",
             "| shard | trees | sims | nodes | trajectories | successes | solved | tokens | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in done:
        lines.append(f"| {s['shard_id']} | {s['trees']} | {s['simulations']} | {s['nodes']} | {s['trajectories']} | "
                     f"{s['successes']} | {s['solved']} | {s['generated_tokens']} | {s['seconds']:.1f} |")
    lines.append(f"| **total** | {total['trees']} | {total['simulations']} | {total['nodes']} | {total['trajectories']} | "
                 f"{total['successes']} | {total['solved']} | {total['generated_tokens']} | |")
    return "\n".join(lines)


def scheduled_run(config: EngineConfig, run_id: str | None, vary_seed: bool) -> tuple[EngineConfig, str | None]:
    """In a deployment's run without a run id: run id `schedule/<name>/<YYYYmmddTHHMM>` and,
    with `vary_seed`, seed + minutes since the epoch of the scheduled time (fresh tasks per run)."""
    from prefect.runtime import deployment, flow_run

    if run_id is not None or not deployment.get_id():
        return config, run_id
    when = flow_run.get_scheduled_start_time()
    run_id = f"schedule/{deployment.get_name()}/{when.strftime('%Y%m%dT%H%M')}"
    if vary_seed:
        config = config.model_copy(update={"seed": config.seed + int(when.timestamp()) // 60})
    return config, run_id


@flow(name="generate", log_prints=False)
def generate_flow(
    config: EngineConfig | None = None,
    run_id: str | None = None,
    runtime: RuntimeConfig | None = None,
    vary_seed: bool = False,
    method: Method | None = None,
) -> dict[str, Any]:
    """Search every shard of `config`'s tasks into `config.store` as run `run_id` (default: the
    generate stage's run id, so the same command resumes; in a scheduled run,
    `schedule/<deployment>/<scheduled time>`, with the seed moved by that time when `vary_seed`).
    method (schedules): overrides config.generate.method. Returns {run_id, shards: [...],
    skipped, store}: every shard of the run in order, those committed by an earlier call with
    skipped=True and their counts read back from the store (a resumed run's totals are the run's)."""
    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    if method is not None:
        config = config.model_copy(update={"generate": config.generate.model_copy(update={"method": method})})
    config, run_id = scheduled_run(config, run_id, vary_seed)
    summary = generate(config, run_id=run_id, execute=prefect_shards(runtime))
    results = [s.as_dict() for s in summary.shards]
    create_markdown_artifact(
        key=artifact_key("generate", summary.run_id),
        markdown=summary_markdown(f"generate ({config.generate.method})", summary.run_id, str(summary.store), results,
                                  summary.shards_skipped),
        description=f"generate run {summary.run_id}",
    )
    return {"run_id": summary.run_id, "shards": results, "skipped": summary.shards_skipped, "store": summary.store}


def run_generate(config: EngineConfig, run_id: str | None = None, runtime: RuntimeConfig | None = None) -> dict[str, Any]:
    """Run the generate flow with the task runner of `runtime` (threads by default, or Ray)."""
    runtime = runtime or RuntimeConfig()
    return generate_flow.with_options(task_runner=make_task_runner(runtime))(config=config, run_id=run_id, runtime=runtime)
