"""`dataengine derive KIND` (datasets from the trees) and `dataengine eval` (held-out metrics)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dataengine.commands.common import MCPOption, MCPStatelessOption, ToolsOption, tools_overrides
from dataengine.commands.common import fail as _fail
from dataengine.commands.common import open_store as _open_store

DEFAULT_STORE = Path(os.environ.get("DATAENGINE_STORE", "runs/store"))


class DeriveKind(str, Enum):
    step_pairs = "step-pairs"
    trajectory_pairs = "trajectory-pairs"
    sft = "sft"
    recovery = "recovery"
    replay = "replay"
    all = "all"


def register(app: typer.Typer) -> None:
    @app.command("derive")
    def derive_command(
        kind: Annotated[DeriveKind, typer.Argument(help="Dataset to derive, or all of them.")],
        store: Annotated[Path, typer.Option("--store", help="Store root folder.")] = DEFAULT_STORE,
        run: Annotated[list[str] | None, typer.Option("--run", help="Source run id (repeat for several).")] = None,
        out_run: Annotated[str | None, typer.Option("--out-run", help="Run id of the written rows (default: the source run).")] = None,
        config: Annotated[Path | None, typer.Option("--config", help="EngineConfig file; its `derive` section sets the defaults.")] = None,
        rule: Annotated[str | None, typer.Option("--rule", help="Step pairs: evidence (verified success or confidence bounds) or margin (value gap alone).")] = None,
        margin: Annotated[float | None, typer.Option("--margin", help="Step pairs under --rule margin: least value gap theta.")] = None,
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
        decontaminate: Annotated[bool | None, typer.Option("--decontaminate/--no-decontaminate", help="Refuse rows whose user question matches a BFCL, tau2 or built-in held-out item (config derive.decontaminate).")] = None,
    ) -> None:
        """Derive step pairs, trajectory pairs, the SFT set, recovery splices or GRPO replay
        prompts from a run's trees and write them to the store (pairs / sft / replay tables)."""
        from dataengine.config import ConfigError, load_config
        from dataengine.derive import KINDS
        from dataengine.stages.datasets import derive_datasets
        from storage import StoreError

        try:
            engine = load_config(config)
        except ConfigError as exc:
            _fail(str(exc))
        if not out_run and len(run or []) != 1:
            _fail("give --run RUN (the source run), or --out-run OUT (the run of the derived rows) to derive "
                  "from several --run or from every run")
        try:
            kinds = list(KINDS) if kind is DeriveKind.all else [kind.value]
            results = derive_datasets(
                _open_store(store), kinds, run_ids=run or None, out_run_id=out_run, derive=engine.derive,
                evaluation=engine.eval, decontaminate=decontaminate,
                pair_rule=rule, margin=margin, min_visits=min_visits, sft_per_task=sft_per_task, replay_low=low, replay_high=high,
                critic_weight=critic_weight, pairs_per_task=pairs_per_task, near_threshold=near,
                replay_min_samples=min_samples, replay_prefixes=prefixes, same_state=same_state,
            )
        except (StoreError, ValueError) as exc:
            _fail(str(exc))
        for r in results:
            typer.echo(json.dumps({"kind": r.kind, "table": r.table, "run_id": r.run_id, "shard_id": r.shard_id,
                                   "rows": r.rows, "version": r.version, "source_versions": r.source_versions,
                                   "seconds": round(r.seconds, 3), "decontaminated": r.decontaminated}, sort_keys=True))
        if any(r.kind == "step-pairs" for r in results):
            from dataengine.derive.audit import stored_audit

            out_runs = sorted({r.run_id for r in results if r.kind == "step-pairs"})
            # The gold is read to report only; selection never sees it.
            for row in stored_audit(_open_store(store), out_runs, run or None).iter_rows(named=True):
                typer.echo(json.dumps({"audit": "step-pairs", **row}, sort_keys=True))

    @app.command("eval")
    def eval_command(
        model: Annotated[str | None, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder (config.policy.model).")] = None,
        suite: Annotated[list[str] | None, typer.Option("--suite", help="Suite (repeat for several; config.suites): a built-in one, bfcl:<category> or tau2:<domain>.")] = None,
        tasks: Annotated[int | None, typer.Option("--tasks", min=1, help="Held-out tasks per suite (config.eval.num_tasks).")] = None,
        store: Annotated[Path | None, typer.Option("--store", help="Store root folder; evals are written there (config.store).")] = None,
        config: Annotated[Path | None, typer.Option("--config", help="EngineConfig file; flags override it.")] = None,
        k: Annotated[int | None, typer.Option("--k", min=0, help="pass@k (0: no sampled episodes).")] = None,
        samples: Annotated[int | None, typer.Option("--samples", help="Episodes per task for pass@k (default k).")] = None,
        search: Annotated[bool | None, typer.Option("--search/--no-search", help="Also measure search-at-inference success.")] = None,
        sims: Annotated[int | None, typer.Option("--sims", min=1, help="Search: simulations per tree.")] = None,
        search_k: Annotated[int | None, typer.Option("--search-k", min=1, help="Search: actions sampled per expansion.")] = None,
        value: Annotated[str | None, typer.Option("--value", help="Search: leaf value, rollout | critic | value_model | zero (config.search.value; zero costs no tokens).")] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="Seed of the held-out tasks and of sampling.")] = None,
        temperature: Annotated[float | None, typer.Option("--temperature", help="Sampling temperature of pass@k episodes.")] = None,
        max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", min=1, help="Tokens per assistant turn.")] = None,
        max_steps: Annotated[int | None, typer.Option("--max-steps", min=1, help="Assistant turns per episode.")] = None,
        few_shot: Annotated[bool | None, typer.Option("--few-shot/--no-few-shot", help="Worked examples in the system prompt.")] = None,
        device: Annotated[str | None, typer.Option("--device", help="auto, cpu or cuda.")] = None,
        backend: Annotated[str | None, typer.Option("--backend", help="hf | vllm | openai (config.policy.backend; openai: a served model at --base-url).")] = None,
        base_url: Annotated[list[str] | None, typer.Option("--base-url", help="openai backend: server base URL (repeat for several; config.policy.base_url).")] = None,
        run_id: Annotated[str | None, typer.Option("--run-id", help="Run id of the evals rows (default eval-<suite>-<seed>).")] = None,
        predictions: Annotated[Path | None, typer.Option("--predictions", help="BFCL suites: write the greedy predictions here as BFCL-format {\"id\", \"calls\"} JSON lines.")] = None,
        batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="Tasks played together (config.eval.batch_size; bounds memory).")] = None,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Evaluate a model on held-out tasks: greedy success, pass@k, search at inference and
        the when/which/how/final axes, with 95% intervals and the configured reward, written to
        the store's evals table. BFCL suites also get BFCL's accuracy (per category, and the
        leaderboard's averages over several), tau2 suites pass^1 with tau2's user simulator."""
        from rich.console import Console
        from rich.table import Table

        from dataengine.config import ConfigError, load_config
        from dataengine.policy.openai import EndpointError
        from dataengine.stages.evaluate import evaluate
        from dataengine.suites.catalog import is_eval_only
        from storage import StoreError

        if few_shot is None and suite and all(is_eval_only(name) for name in suite):
            few_shot = False  # benchmarks are scored with their own prompt: no foreign worked examples
        if max_steps is None and suite and all(_single_turn_bfcl(name) for name in suite):
            max_steps = 1  # BFCL scores the first response of a single-turn entry; later turns cost tokens only
        try:
            engine = load_config(
                config, store=str(store) if store else None, suites=list(suite) if suite else None,
                eval__batch_size=batch_size,
                policy__model=model, policy__device=device, policy__few_shot=few_shot, env__max_steps=max_steps,
                policy__backend=backend, policy__base_url=list(base_url) if base_url else None,
                eval__num_tasks=tasks, eval__k=k, eval__samples=samples, eval__search=search,
                eval__search_simulations=sims, eval__search_actions=search_k, eval__seed=seed,
                eval__temperature=temperature, eval__max_new_tokens=max_new_tokens,
                search__max_depth=max_steps, search__value=value,
                **tools_overrides(tools, mcp, mcp_stateless, config=config),
            )
            if predictions is not None and not any(s.startswith("bfcl:") for s in engine.eval.suites or engine.suites):
                raise ValueError("--predictions needs a BFCL suite (--suite bfcl:<category>)")
            results = evaluate(engine, run_id)
        except (ConfigError, StoreError, FileNotFoundError, ValueError, EndpointError) as exc:
            _fail(str(exc))
        for r in results:
            table = Table("metric", "value", "95% CI", "n",
                          title=f"{r['model_id']} on {engine.eval.num_tasks} held-out {r['suite']} tasks")
            for name, (value, low, high) in r["metrics"].items():
                ci = f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
                table.add_row(name, "-" if value is None else f"{value:.3f}", ci, str(r["n"].get(name, "")))
            Console().print(table)
            done = "already in the store (skipped)" if r["skipped"] else f"evals table version {r['version']}; {r['seconds']:.1f} s"
            typer.echo(f"{r['suite']}: {done}")
        _report_benchmarks(results, predictions)

    @app.command("rescore")
    def rescore_command(
        run: Annotated[str, typer.Option("--run", help="Stored run whose trajectories are re-scored.")],
        store: Annotated[Path | None, typer.Option("--store", help="Store root folder (config.store).")] = None,
        out_run: Annotated[str | None, typer.Option("--out-run", help="Run id of the rescored rows (default <run>/rescore).")] = None,
        config: Annotated[Path | None, typer.Option("--config", help="EngineConfig file; its reward and sandbox sections apply.")] = None,
    ) -> None:
        """Replay a stored run's trajectories through a fresh ToolEnv and score them with the
        current verifiers (after a verifier changed); written as a new run, shard by shard."""
        from dataengine.config import ConfigError, load_config
        from dataengine.stages.rescore import rescore
        from storage import StoreError

        try:
            engine = load_config(config, store=str(store) if store else None)
            results = rescore(engine, run, out_run).shards
        except (ConfigError, StoreError, ValueError) as exc:
            _fail(str(exc))
        if not results:
            typer.echo(f"run {run}: every shard already rescored; nothing to do")
        for r in results:
            typer.echo(json.dumps(asdict(r), sort_keys=True))


def _single_turn_bfcl(name: str) -> bool:
    from dataengine.external.bfcl.tasks import MULTI_TURN_CATEGORIES
    from dataengine.suites.catalog import bfcl_category

    try:
        category = bfcl_category(name)
    except ValueError:
        return False  # an unknown name: the config's check reports it
    return category is not None and category not in MULTI_TURN_CATEGORIES


def _report_benchmarks(results: list[dict], predictions: Path | None) -> None:
    """BFCL accuracy per category (and the leaderboard's averages over several), tau2's pass^1,
    and the BFCL predictions file."""
    from dataengine.evaluation.benchmarks import bfcl_summary, write_predictions

    scores = {category: score for r in results for category, score in r.get("bfcl", {}).items()}
    for category, score in scores.items():
        typer.echo(f"BFCL {category}: accuracy {score['valid'] / score['tasks']:.4f} ({score['valid']}/{score['tasks']} valid)")
    for r in results:
        if "pass^1" in r["metrics"]:
            value, low, high = r["metrics"]["pass^1"]
            typer.echo(f"tau2 {r['suite'].split(':', 1)[1]}: pass^1 {value:.4f} [{low:.3f}, {high:.3f}] over {r['n']['pass^1']} tasks")
    if len(scores) > 1:
        summary = bfcl_summary({c: s["valid"] / s["tasks"] for c, s in scores.items()}, {c: s["tasks"] for c, s in scores.items()})
        for group in ("non_live_ast", "live_ast", "multi_turn"):
            if summary[group] is not None:
                missing = summary["missing"].get(group)
                note = f" (not evaluated, counted 0 as the leaderboard does: {', '.join(missing)})" if missing else ""
                typer.echo(f"BFCL {group} summary: {summary[group]:.4f}{note}")
    if predictions is not None:
        written = write_predictions(predictions, [p for s in scores.values() for p in s["predictions"]])
        typer.echo(f"predictions: {written} lines -> {predictions}")
