"""`dataengine generate`: search (or sample) tool-use episodes and write the trees to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dataengine.commands.common import MCPOption, MCPStatelessOption, ToolsOption, fail, open_store, tools_overrides


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_command(
        suite: Annotated[list[str] | None, typer.Option("--suite", help="Suite name (repeat for several; bfcl:<category> and tau2:<domain> are eval-only: --split heldout); default: config.suites.")] = None,
        tasks: Annotated[int | None, typer.Option("--tasks", min=1, help="Tasks per suite (config.num_tasks).")] = None,
        task_file: Annotated[Path | None, typer.Option("--task-file", help="Search the tasks of a .jsonl/.parquet task file instead of generating a suite.")] = None,
        model: Annotated[str | None, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder (config.policy.model).")] = None,
        sims: Annotated[int | None, typer.Option("--sims", min=1, help="Simulations per tree (config.search.num_simulations).")] = None,
        k: Annotated[int | None, typer.Option("--k", min=1, help="Candidate actions sampled per expansion (config.search.num_actions).")] = None,
        store: Annotated[str | None, typer.Option("--store", "--out", help="Store folder (config.store); --out is the old name.")] = None,
        config: Annotated[Path | None, typer.Option("--config", help="EngineConfig file (.yaml/.toml); flags override it.")] = None,
        method: Annotated[str | None, typer.Option("--method", help="mcts | best_of_n | greedy (config.generate.method).")] = None,
        split: Annotated[str | None, typer.Option("--split", help="train | heldout (config.split).")] = None,
        level: Annotated[list[int] | None, typer.Option("--level", help="Difficulty level of the suites' tasks (repeat; config.levels; default all).")] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="Seed of tasks, sampling and search (config.seed).")] = None,
        run_id: Annotated[str | None, typer.Option("--run-id", help="Run id; a rerun with the same id skips committed shards. Default: a hash of config, method and tasks.")] = None,
        algorithm: Annotated[str | None, typer.Option("--algorithm", help="puct | uct | gumbel (config.search.algorithm).")] = None,
        value: Annotated[str | None, typer.Option("--value", help="Leaf value: rollout | critic | value_model | zero | reference (config.search.value; reference is oracle-assisted: progress along the task's reference calls).")] = None,
        critic_mix: Annotated[float | None, typer.Option("--critic-mix", help="a in a*V + (1-a)*critic (1 = no critic).")] = None,
        max_depth: Annotated[int | None, typer.Option("--max-depth", min=1, help="Deepest node (assistant turns).")] = None,
        max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Generated-token budget per task.")] = None,
        max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", min=1, help="Tokens per action at most.")] = None,
        leaves: Annotated[int | None, typer.Option("--leaves", min=1, help="Leaves per tree per iteration (L).")] = None,
        trees: Annotated[int | None, typer.Option("--trees", min=1, help="Trees searched together (B).")] = None,
        shard_size: Annotated[int | None, typer.Option("--shard-size", min=1, help="Tasks per shard (unit of commit and resume).")] = None,
        n: Annotated[int | None, typer.Option("--n", min=1, help="best_of_n: episodes per task (config.generate.n; default --sims).")] = None,
        rollouts: Annotated[int | None, typer.Option("--rollouts", min=1, help="Rollouts per leaf for --value rollout (config.generate.rollouts).")] = None,
        value_model: Annotated[Path | None, typer.Option("--value-model", help="Fitted value head (ValueModel.save) for --value value_model (config.generate.value_model).")] = None,
        prior: Annotated[str | None, typer.Option("--prior", help="logprob | frequency (config.generate.prior).")] = None,
        temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature (config.policy.temperature; 0.7 makes SmolLM2 call tools most).")] = None,
        device: Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda (config.policy.device).")] = None,
        backend: Annotated[str | None, typer.Option("--backend", help="hf | vllm | openai (config.policy.backend; vllm needs vLLM installed; openai is a served model, --base-url).")] = None,
        base_url: Annotated[list[str] | None, typer.Option("--base-url", help="openai backend: server base URL, e.g. http://127.0.0.1:8000/v1 (repeat for several; config.policy.base_url).")] = None,
        progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Search tool-use episodes (MCTS) or sample them (best_of_n, greedy); write trees,
        trajectories and lineage to the store, shard by shard (resumable)."""
        import json

        from dataengine.config import ConfigError, load_config
        from dataengine.stages.generate import generate
        from dataengine.suites.catalog import check_suite_name

        for name in suite or ():
            try:
                check_suite_name(name)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--suite") from None
        if value_model is not None and not value_model.is_file():
            raise typer.BadParameter(f"value head file {value_model} does not exist", param_hint="--value-model")
        if task_file is not None and not task_file.is_file():
            raise typer.BadParameter(f"task file {task_file} does not exist", param_hint="--task-file")
        try:
            cfg = load_config(
                config,
                store=store,
                seed=seed,
                suites=list(suite) if suite else None,
                num_tasks=tasks,
                task_file=str(task_file) if task_file else None,
                split=split,
                levels=list(level) if level else None,
                shard_size=shard_size,
                policy__model=model,
                policy__device=device,
                policy__backend=backend,
                policy__base_url=list(base_url) if base_url else None,
                policy__max_new_tokens=max_new_tokens,
                policy__temperature=temperature,
                search__num_simulations=sims,
                search__num_actions=k,
                search__algorithm=algorithm,
                search__value=value,
                search__critic_mix=critic_mix,
                search__max_depth=max_depth,
                search__max_generated_tokens=max_tokens,
                search__leaves_per_iteration=leaves,
                search__trees_per_batch=trees,
                generate__method=method,
                generate__n=n,
                generate__rollouts=rollouts,
                generate__prior=prior,
                generate__value_model=str(value_model) if value_model else None,
                **tools_overrides(tools, mcp, mcp_stateless, config=config),
            )
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        if cfg.search.value == "value_model" and cfg.generate.value_model is None:
            raise typer.BadParameter("--value value_model needs --value-model FILE", param_hint="--value-model")
        if cfg.policy.backend != "openai" and cfg.policy.model not in ("smollm2", "tiny") and not (Path(cfg.policy.model) / "config.json").is_file():
            raise typer.BadParameter(
                f"model {cfg.policy.model!r} is not 'smollm2', 'tiny' or a folder with a config.json", param_hint="--model"
            )
        from dataengine.policy.openai import EndpointError
        from dataengine.suites import TaskFileError
        from storage.errors import StoreError

        # A store path that cannot be a store (a plain file, ...) fails before the model loads.
        open_store(cfg.store, create=True)
        try:
            summary = generate(cfg, run_id=run_id, progress=progress)
        except StoreError as exc:
            fail(exc)
        except (TaskFileError, ValueError, TypeError, EndpointError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        # stdout is the JSON summary alone (scripts take run_id from it); the human line goes to stderr.
        typer.echo(json.dumps(summary.as_dict(), indent=1))
        if summary.shards_written == 0:
            typer.echo(f"run {summary.run_id}: all {summary.shards_skipped} shard(s) already committed in {summary.store}; nothing to do", err=True)
            return
        typer.echo(
            f"run {summary.run_id}: {summary.trees} trees, {summary.successes} successful trajectories "
            f"({summary.solved} tasks solved), {summary.generated_tokens} generated tokens, "
            f"{summary.seconds:.1f} s ({summary.model_seconds:.1f} s in the model) -> {summary.store}",
            err=True,
        )
