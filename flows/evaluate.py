"""The evaluate flow: greedy success (and pass@k) of a model on held-out tasks of each suite,
one Prefect task per suite, written to the store's evals table. Thin: the flow is the evaluate
stage's driver (dataengine.stages.evaluate.evaluate) handed Prefect tasks, each running the
stage's suite function (evaluate_suite_at)."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import EngineConfig, RuntimeConfig
from dataengine.stages.evaluate import EvaluateExecutor, evaluate, evaluate_suite_at
from flows.runtime import accelerator_slot, artifact_key, ensure_accelerator_limit, make_task_runner, submit_shards


@task(name="evaluate-suite", task_run_name="evaluate {suite} ({run_id})", tags=["dataengine", "accelerator"])
def evaluate_suite(config: EngineConfig, suite: str, run_id: str) -> dict[str, Any]:
    """The evaluate stage's suite function (`evaluate_suite_at`) holding an accelerator slot."""
    return evaluate_suite_at(config, suite, run_id, slot=accelerator_slot)


def prefect_suites(runtime: RuntimeConfig) -> EvaluateExecutor:
    """The evaluate stage's executor on Prefect: one `evaluate_suite` task per suite."""
    def execute(config: EngineConfig, suites: list[tuple[str, str, list[Any]]]) -> list[dict[str, Any]]:
        ensure_accelerator_limit(runtime.accelerator_slots)
        return submit_shards(evaluate_suite, runtime, [(config, suite, run_id) for suite, run_id, _ in suites])

    return execute


def evaluation_markdown(run_id: str, results: list[dict[str, Any]]) -> str:
    lines = [f"# evaluate `{run_id}`", "", "| suite | model | metric | value | 95% CI |", "|---|---|---|---|---|"]
    for r in results:
        for name, (value, low, high) in sorted(r["metrics"].items()):
            ci = f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
            shown = f"{value:.3f}" if value is not None else "n/a"
            lines.append(f"| {r['suite']} | `{r['model_id']}` | {name} | {shown} | {ci} |")
    return "\n".join(lines)


@flow(name="evaluate", log_prints=False)
def evaluate_flow(config: EngineConfig | None = None, run_id: str = "evaluate",
                  runtime: RuntimeConfig | None = None) -> list[dict[str, Any]]:
    """Evaluate config.policy.model on config.eval.num_tasks held-out tasks of every suite in
    config.suites (config.eval: pass@k, search at inference, seed)."""
    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    results = evaluate(config, run_id, execute=prefect_suites(runtime))
    create_markdown_artifact(key=artifact_key("evaluate", run_id), markdown=evaluation_markdown(run_id, results))
    return results


def run_evaluate(config: EngineConfig, run_id: str, runtime: RuntimeConfig | None = None) -> list[dict[str, Any]]:
    runtime = runtime or RuntimeConfig()
    return evaluate_flow.with_options(task_runner=make_task_runner(runtime))(config=config, run_id=run_id,
                                                                             runtime=runtime)
