"""The generate flow: one Prefect task per shard of a config's tasks.

Thin: each shard task runs the generate stage (`dataengine.stages.generate.generate_shard`)
with the policy and sandbox its process keeps (`shared_resources`), holding an accelerator slot.
A rerun with the same run id skips committed shards, so a failed or killed run resumes where it
stopped; the CLI's `dataengine generate` runs the same stage function, so both write the same
trees.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import EngineConfig
from flows.runtime import (
    RuntimeConfig,
    accelerator_slot,
    artifact_key,
    ensure_accelerator_limit,
    make_task_runner,
    node_info,
    ray_options,
    shard_options,
)

Method = Literal["mcts", "best_of_n", "greedy"]


@task(name="generate-shard", task_run_name="generate {run_id} shard {index}", tags=["dataengine", "accelerator"])
def generate_shard(config: EngineConfig, run_id: str, index: int) -> dict[str, Any]:
    """Shard `index` of the config's tasks, searched and committed (or skipped when committed);
    the counts plus model_id and verifier_versions for the run's lineage row, and `node`:
    where it ran (`node_info`: hostname, pid, Ray node id)."""
    from dataengine.stages.generate import generate_shard as run_stage
    from dataengine.stages.generate import plan_generate
    from dataengine.stages.progress import Progress
    from dataengine.stages.resources import open_store, shared_resources

    plan = plan_generate(config, run_id=run_id)
    if not 0 <= index < len(plan.shards):
        raise ValueError(f"shard index {index} out of range: the config has {len(plan.shards)} shard(s)")
    shard = plan.shards[index]
    if shard.shard_id in open_store(config.store).committed_shards("tasks", run_id):
        return {"shard_id": shard.shard_id, "skipped": True, "trees": 0, "node": node_info()}
    with accelerator_slot():
        res = shared_resources(config, plan.toolboxes)
        label = f"{config.generate.method} shard {index}"
        with Progress(len(shard.tasks), label, terminal=False, log=get_run_logger().info) as bar:
            result = run_stage(res, run_id, shard, on_progress=bar.update).as_dict()
    return {**result, "model_id": res.policy.model_id, "verifier_versions": res.reward.versions(), "node": node_info()}


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
    from dataengine.stages.generate import committed_shard_counts, plan_generate, record_generate_run
    from dataengine.stages.resources import open_store

    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    if method is not None:
        config = config.model_copy(update={"generate": config.generate.model_copy(update={"method": method})})
    config, run_id = scheduled_run(config, run_id, vary_seed)
    plan = plan_generate(config, run_id=run_id)
    store = open_store(config.store)
    todo = plan.todo(store)
    plan.check_resume(store)
    if todo and not store.committed_shards("tasks", plan.run_id):
        # A fresh run puts its settings key on record before its first shard commits (the model
        # id, known in the shards' processes, comes with the row rewritten after them).
        record_generate_run(store, config, plan, model_id=None, verifier_versions=None)
    ensure_accelerator_limit(runtime.accelerator_slots)
    shard_task = generate_shard.with_options(**shard_options(runtime))
    if runtime.task_runner == "ray" and ray_options(runtime):
        from prefect_ray.context import remote_options

        with remote_options(**ray_options(runtime)):
            futures = [shard_task.submit(config, plan.run_id, s.index) for s in todo]
    else:
        futures = [shard_task.submit(config, plan.run_id, s.index) for s in todo]
    new = {r["shard_id"]: r for r in (f.result() for f in futures) if not r.get("skipped")}
    stored = committed_shard_counts(store, plan.run_id) if len(new) < len(plan.shards) else {}
    results = [new.get(s.shard_id) or stored[s.shard_id].as_dict() for s in plan.shards]
    done = [r for r in results if not r.get("skipped")]
    if done:
        record_generate_run(store, config, plan, model_id=done[0]["model_id"],
                            verifier_versions=done[0]["verifier_versions"])
    skipped = len(plan.shards) - sum(not r.get("skipped") for r in results)
    create_markdown_artifact(
        key=artifact_key("generate", plan.run_id),
        markdown=summary_markdown(f"generate ({config.generate.method})", plan.run_id, str(store.root), results, skipped),
        description=f"generate run {plan.run_id}",
    )
    return {"run_id": plan.run_id, "shards": results, "skipped": skipped, "store": str(store.root)}


def run_generate(config: EngineConfig, run_id: str | None = None, runtime: RuntimeConfig | None = None) -> dict[str, Any]:
    """Run the generate flow with the task runner of `runtime` (threads by default, or Ray)."""
    runtime = runtime or RuntimeConfig()
    return generate_flow.with_options(task_runner=make_task_runner(runtime))(config=config, run_id=run_id, runtime=runtime)
