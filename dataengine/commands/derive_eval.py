"""`dataengine derive KIND` (datasets from the trees) and `dataengine eval` (held-out metrics)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_STORE = Path(os.environ.get("DATAENGINE_STORE", "runs/store"))


class DeriveKind(str, Enum):
    step_pairs = "step-pairs"
    trajectory_pairs = "trajectory-pairs"
    sft = "sft"
    recovery = "recovery"
    replay = "replay"
    all = "all"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


def _open_store(path: Path, *, create: bool = False):
    from storage import Store, StoreError

    try:
        return Store(path, create=create)
    except StoreError as exc:
        _fail(str(exc))


def register(app: typer.Typer) -> None:
    @app.command("derive")
    def derive_command(
        kind: Annotated[DeriveKind, typer.Argument(help="Dataset to derive, or all of them.")],
        store: Annotated[Path, typer.Option("--store", help="Store root folder.")] = DEFAULT_STORE,
        run: Annotated[list[str] | None, typer.Option("--run", help="Source run id (repeat for several).")] = None,
        out_run: Annotated[str | None, typer.Option("--out-run", help="Run id of the written rows (default: the source run).")] = None,
        config: Annotated[Path | None, typer.Option("--config", help="EngineConfig file; its `derive` section sets the defaults.")] = None,
        margin: Annotated[float | None, typer.Option("--margin", help="Step pairs: least value gap theta.")] = None,
        min_visits: Annotated[int | None, typer.Option("--min-visits", help="Step pairs: least visits of both actions.")] = None,
        critic_weight: Annotated[float, typer.Option("--critic-weight", help="Step pairs: w in (1-w)*Q + w*critic.")] = 0.0,
        pairs_per_task: Annotated[int, typer.Option("--pairs-per-task", help="Trajectory pairs kept per task.")] = 4,
        sft_per_task: Annotated[int | None, typer.Option("--sft-per-task", help="SFT: k trajectories per task.")] = None,
        near: Annotated[float | None, typer.Option("--near", help="SFT: near-duplicate cosine threshold (off by default).")] = None,
        low: Annotated[float | None, typer.Option("--low", help="Replay: p_success must be above this.")] = None,
        high: Annotated[float | None, typer.Option("--high", help="Replay: p_success must be below this.")] = None,
        min_samples: Annotated[int, typer.Option("--min-samples", help="Replay: trajectories needed per prompt.")] = 2,
        prefixes: Annotated[bool, typer.Option("--prefixes/--no-prefixes", help="Replay: internal nodes as prompts too.")] = True,
        same_state: Annotated[bool, typer.Option("--same-state/--any-state", help="Recovery and replay prefixes only where the tool state is unchanged.")] = True,
    ) -> None:
        """Derive step pairs, trajectory pairs, the SFT set, recovery splices or GRPO replay
        prompts from a run's trees and write them to the store (pairs / sft / replay tables)."""
        from dataengine.config import ConfigError, load_config
        from dataengine.derive import KINDS, DeriveOptions, derive

        try:
            engine = load_config(config)
        except ConfigError as exc:
            _fail(str(exc))
        try:
            options = DeriveOptions.from_config(
                engine.derive, margin=margin, min_visits=min_visits, sft_per_task=sft_per_task,
                replay_low=low, replay_high=high, critic_weight=critic_weight, pairs_per_task=pairs_per_task,
                near_threshold=near, replay_min_samples=min_samples, replay_prefixes=prefixes, same_state=same_state,
            )
            kinds = list(KINDS) if kind is DeriveKind.all else [kind.value]
            results = derive(_open_store(store), kinds, run_ids=run or None, out_run_id=out_run, options=options)
        except ValueError as exc:
            _fail(str(exc))
        for r in results:
            typer.echo(json.dumps({"kind": r.kind, "table": r.table, "run_id": r.run_id, "shard_id": r.shard_id,
                                   "rows": r.rows, "version": r.version, "source_versions": r.source_versions,
                                   "seconds": round(r.seconds, 3)}, sort_keys=True))

    @app.command("eval")
    def eval_command(
        model: Annotated[str, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder.")] = "smollm2",
        suite: Annotated[str, typer.Option("--suite", help="Built-in suite.")] = "arithmetic",
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="Held-out tasks.")] = 20,
        store: Annotated[Path, typer.Option("--store", help="Store root folder (evals are written there).")] = DEFAULT_STORE,
        k: Annotated[int, typer.Option("--k", min=0, help="pass@k (0: no sampled episodes).")] = 0,
        samples: Annotated[int | None, typer.Option("--samples", help="Episodes per task for pass@k (default k).")] = None,
        search: Annotated[bool, typer.Option("--search/--no-search", help="Also measure search-at-inference success.")] = False,
        sims: Annotated[int, typer.Option("--sims", min=1, help="Search: simulations per tree.")] = 8,
        search_k: Annotated[int, typer.Option("--search-k", min=1, help="Search: actions sampled per expansion.")] = 4,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the held-out tasks and of sampling.")] = 0,
        temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature of pass@k episodes.")] = 1.0,
        max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Tokens per assistant turn.")] = 96,
        max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="Assistant turns per episode.")] = 6,
        few_shot: Annotated[bool, typer.Option("--few-shot/--no-few-shot", help="Worked examples in the system prompt.")] = True,
        device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
        run_id: Annotated[str | None, typer.Option("--run-id", help="Run id of the evals rows (default eval-<suite>-<seed>).")] = None,
    ) -> None:
        """Evaluate a model on held-out tasks: greedy success, pass@k, search at inference and
        the when/which/how/final axes, with 95% intervals, written to the store's evals table."""
        from rich.console import Console
        from rich.table import Table

        from dataengine.evaluation import EvalConfig, write_report
        from dataengine.suites import SUITE_MODULES, generate_suite

        if suite not in SUITE_MODULES:
            _fail(f"unknown suite {suite!r}; known suites: {', '.join(SUITE_MODULES)}")
        config = EvalConfig(k=k, samples=samples, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
        try:
            config.validate()
        except ValueError as exc:
            _fail(str(exc))
        held_out = generate_suite(suite, n_train=0, n_heldout=tasks, seed=seed)
        db = _open_store(store, create=True)
        report, settings = run_eval(model, held_out, config, search=search, sims=sims, search_k=search_k,
                                    max_steps=max_steps, few_shot=few_shot, device=device, seed=seed)
        version = write_report(db, report, run_id=run_id or f"eval-{suite}-{seed}", config=settings)
        table = Table("metric", "value", "95% CI", "n", title=f"{report.model_id} on {tasks} held-out {suite} tasks")
        for m in report.metrics:
            value = "-" if m.value is None else f"{m.value:.3f}"
            table.add_row(m.metric, value, f"[{m.ci_low:.3f}, {m.ci_high:.3f}]", str(m.n))
        Console().print(table)
        typer.echo(f"evals table version {version}; {report.seconds:.1f} s")


def run_eval(model: str, tasks: list, config, *, search: bool = False, sims: int = 8, search_k: int = 4,
             max_steps: int = 6, few_shot: bool = True, device: str = "auto", seed: int = 0, policy=None):
    """Load `model`, open a sandbox and evaluate; returns (EvalReport, settings dict)."""
    from dataengine.config import EngineConfig
    from dataengine.env import ToolEnv
    from dataengine.evaluation import evaluate
    from dataengine.evaluation.search import search_at_inference
    from dataengine.policy import make_policy
    from dataengine.tools.sandbox import Sandbox

    if policy is None:
        policy = make_policy("hf", model, device=device, fewshot=few_shot)
    engine = EngineConfig(
        seed=seed,
        env={"max_steps": max_steps},
        policy={"model": model, "max_new_tokens": config.max_new_tokens, "few_shot": few_shot},
        search={"num_simulations": sims, "num_actions": search_k, "max_depth": max_steps},
    )
    settings = {"model": model, "eval": asdict(config), "search": engine.search.model_dump() if search else None,
                "max_steps": max_steps, "few_shot": few_shot}
    with Sandbox(workers=2, preload=sorted({t.toolbox for t in tasks})) as sandbox:
        env = ToolEnv(sandbox, max_steps=max_steps)
        finder = search_at_inference(policy, env, engine, seed=seed) if search else None
        report = evaluate(policy, env, tasks, config, search=finder)
    return report, settings
