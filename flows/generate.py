"""The generate flow: search (or sample) a config's tasks, one Prefect task per shard.

Each shard task loads (once per process) the policy and sandbox, holds an accelerator slot
while it runs `dataengine.search.run_shard`, and commits the shard with `write_shard` (nodes,
trajectories, then tasks: the commit marker). A rerun with the same run id skips the shards
already in the store (`Store.committed_shards("tasks", run_id)`), so a failed or killed run
resumes where it stopped. Seeds per shard match `dataengine generate` (seed + 1000 * index),
so the flow and the CLI write the same trees.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import EngineConfig
from flows.runtime import (
    RuntimeConfig,
    accelerator_slot,
    artifact_key,
    ensure_accelerator_limit,
    env_for,
    make_task_runner,
    policy_for,
    ray_options,
    shard_options,
)

Method = Literal["mcts", "best_of_n", "greedy"]
SHARD_SEED_STRIDE = 1_000


def shard_plan(config: EngineConfig) -> list[tuple[int, str, list[Any]]]:
    """(index, shard_id, tasks) of every shard of the config's tasks, in order."""
    from dataengine.search import config_tasks, shards

    return [(i, sid, part) for i, (sid, part) in enumerate(shards(config_tasks(config), config.shard_size))]


def generate_shard_work(config: EngineConfig, method: str, run_id: str, index: int, n: int | None = None) -> dict[str, Any]:
    """Search shard `index` of the config's tasks and commit it; the plain function a shard task
    runs. Returns counts: shard_id, trees, simulations, nodes, trajectories, successes,
    generated_tokens, seconds, model_id, skipped (already committed)."""
    from dataengine.search import make_reward, run_shard, write_shard
    from storage import Store

    start = time.perf_counter()
    plan = shard_plan(config)
    if not 0 <= index < len(plan):
        raise ValueError(f"shard index {index} out of range: the config has {len(plan)} shard(s)")
    _, shard_id, tasks = plan[index]
    store = Store(config.store)
    if shard_id in store.committed_shards("tasks", run_id):
        return {"shard_id": shard_id, "skipped": True, "trees": 0}
    with accelerator_slot():
        policy = policy_for(config)
        env = env_for(config, sorted({t.toolbox for t in tasks}))
        reward = make_reward(config, env)
        out = run_shard(shard_id, tasks, method=method, policy=policy, env=env, reward=reward, config=config,
                        seed=config.seed + SHARD_SEED_STRIDE * index, n=n)
    write_shard(store, out, run_id)
    return {
        "shard_id": shard_id,
        "skipped": False,
        "trees": len(tasks),
        "simulations": out.simulations,
        "nodes": len(out.nodes),
        "trajectories": len(out.trajectories),
        "successes": sum(bool(t["success"]) for t in out.trajectories),
        "solved": len({t["task_id"] for t in out.trajectories if t["success"]}),
        "generated_tokens": out.generated_tokens,
        "seconds": time.perf_counter() - start,
        "model_id": policy.model_id,
        "verifier_versions": reward.versions(),
    }


@task(name="generate-shard", task_run_name="generate {run_id} shard {index}", tags=["dataengine", "accelerator"])
def generate_shard(config: EngineConfig, method: str, run_id: str, index: int, n: int | None = None) -> dict[str, Any]:
    return generate_shard_work(config, method, run_id, index, n)


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


def default_run_id(config: EngineConfig, method: str) -> str:
    from dataengine.search import config_tasks
    from dataengine.search import default_run_id as search_run_id

    return search_run_id(config, method, config_tasks(config))


@flow(name="generate", flow_run_name="generate {method}", log_prints=False)
def generate_flow(
    config: EngineConfig | None = None,
    method: Method = "mcts",
    run_id: str | None = None,
    n: int | None = None,
    runtime: RuntimeConfig | None = None,
    vary_seed: bool = False,
) -> dict[str, Any]:
    """Search every shard of `config`'s tasks into `config.store` as run `run_id` (default: a
    hash of the config, so the same command resumes; in a scheduled run,
    `schedule/<deployment>/<scheduled time>`, with the seed moved by that time when `vary_seed`).
    Returns {run_id, shards: [...], skipped, store}."""
    from storage import Store

    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    config, run_id = scheduled_run(config, run_id, vary_seed)
    run_id = run_id or default_run_id(config, method)
    store = Store(config.store)
    plan = shard_plan(config)
    committed = store.committed_shards("tasks", run_id)
    todo = [i for i, sid, _ in plan if sid not in committed]
    ensure_accelerator_limit(runtime.accelerator_slots)
    shard_task = generate_shard.with_options(**shard_options(runtime))
    futures = []
    if runtime.task_runner == "ray" and ray_options(runtime):
        from prefect_ray.context import remote_options

        with remote_options(**ray_options(runtime)):
            futures = [shard_task.submit(config, method, run_id, i, n) for i in todo]
    else:
        futures = [shard_task.submit(config, method, run_id, i, n) for i in todo]
    results = [f.result() for f in futures]
    done = [r for r in results if not r.get("skipped")]
    if done:
        store.record_run(
            run_id,
            kind="generate",
            config={"engine": config.model_dump(mode="json"), "method": method, "n": n, "runtime": runtime.model_dump()},
            model_id=done[0]["model_id"],
            checkpoint_hash=done[0]["model_id"].rsplit("@", 1)[-1] if "@" in done[0]["model_id"] else None,
            verifier_versions=done[0]["verifier_versions"],
            seed=config.seed,
            source_versions=store.table_versions(),
        )
    skipped = len(plan) - len(done)
    create_markdown_artifact(
        key=artifact_key("generate", run_id),
        markdown=summary_markdown(f"generate ({method})", run_id, str(store.root), results, skipped),
        description=f"generate run {run_id}",
    )
    return {"run_id": run_id, "shards": results, "skipped": skipped, "store": str(store.root)}


def run_generate(config: EngineConfig, method: Method = "mcts", run_id: str | None = None, n: int | None = None,
                 runtime: RuntimeConfig | None = None) -> dict[str, Any]:
    """Run the generate flow with the task runner of `runtime` (threads by default, or Ray)."""
    runtime = runtime or RuntimeConfig()
    return generate_flow.with_options(task_runner=make_task_runner(runtime))(
        config=config, method=method, run_id=run_id, n=n, runtime=runtime
    )
