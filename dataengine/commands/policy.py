"""`dataengine policy ...`: render prompts, sample replies, probe tool-call rates and gold-step
probabilities, fetch models."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    policy_app = typer.Typer(help="Policy models: prepare, render, sample, probe.", no_args_is_help=True)

    @policy_app.command("prepare")
    def prepare_command(
        model: Annotated[str, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder.")] = "smollm2",
    ) -> None:
        """Convert and cache a model (SmolLM2's GGUF -> safetensors) and print its id."""
        from dataengine.models import load_model, model_id

        lm, _ = load_model(model)
        typer.echo(model_id(lm))

    @policy_app.command("render")
    def render_command(
        suite: Annotated[str, typer.Option("--suite", help="Suite whose first task is rendered.")] = "arithmetic",
        model: Annotated[str, typer.Option("--model", help="Model whose tokenizer renders.")] = "tiny",
        fewshot: Annotated[bool, typer.Option("--fewshot/--no-fewshot", help="Include the worked examples.")] = True,
        listing: Annotated[str, typer.Option("--listing", help="Tool listing: compact or json.")] = "compact",
    ) -> None:
        """Print the prompt the policy sees for a suite's first task."""
        from dataengine.policy import Conversation, make_policy
        from dataengine.suites import generate_suite

        task = generate_suite(suite, 1, 0, seed=0)[0]
        policy = make_policy("hf", model, fewshot=fewshot, listing=listing)
        typer.echo(policy.render(Conversation.from_task(task)))

    @policy_app.command("probe")
    def probe_command(
        suite: Annotated[str, typer.Option("--suite", help="Suite to draw tasks from.")] = "arithmetic",
        model: Annotated[str, typer.Option("--model", help="'smollm2', 'tiny' or a folder.")] = "smollm2",
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="Number of tasks.")] = 16,
        k: Annotated[int, typer.Option("--k", min=1, help="Samples per task.")] = 4,
        max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
        temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 1.0,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        fewshot: Annotated[bool, typer.Option("--fewshot/--no-fewshot", help="Include the worked examples.")] = True,
        backend: Annotated[str, typer.Option("--backend", help="hf or vllm.")] = "hf",
        device: Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")] = "auto",
        listing: Annotated[str, typer.Option("--listing", help="Tool listing: compact or json.")] = "compact",
    ) -> None:
        """Sample first replies to a suite's tasks and print how often they are valid tool calls."""
        from dataengine.policy import make_policy
        from dataengine.policy.probe import tool_call_rate
        from dataengine.suites import SUITE_MODULES, generate_suite

        if suite not in SUITE_MODULES:
            raise typer.BadParameter(f"unknown suite {suite!r}; known: {', '.join(SUITE_MODULES)}", param_hint="--suite")
        options = {"fewshot": fewshot, "device": device, "listing": listing} if backend == "hf" else {}
        policy = make_policy(backend, model, **options)
        report = tool_call_rate(
            policy, generate_suite(suite, tasks, 0, seed=seed), k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )
        typer.echo(json.dumps(report, indent=1))

    @policy_app.command("gold-steps")
    def gold_steps_command(
        suite: Annotated[str, typer.Option("--suite", help="Suite to draw tasks from.")] = "arithmetic",
        model: Annotated[str, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder.")] = "smollm2",
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="Number of tasks.")] = 60,
        split: Annotated[str, typer.Option("--split", help="train or heldout tasks.")] = "train",
        level: Annotated[list[int] | None, typer.Option("--level", help="Difficulty level of the tasks (repeat; default all).")] = None,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        fewshot: Annotated[bool, typer.Option("--fewshot/--no-fewshot", help="Include the worked examples.")] = True,
        device: Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")] = "auto",
    ) -> None:
        """Print the policy's probability of each gold turn given the gold turns before it, per
        difficulty level and step: where its path to a solution breaks."""
        from dataengine.env import ToolEnv
        from dataengine.gold_demo import gold_step_probabilities
        from dataengine.policy import make_policy
        from dataengine.suites import SUITE_MODULES, generate_suite
        from dataengine.tools.sandbox import Sandbox

        if suite not in SUITE_MODULES:
            raise typer.BadParameter(f"unknown suite {suite!r}; known: {', '.join(SUITE_MODULES)}", param_hint="--suite")
        if split not in ("train", "heldout"):
            raise typer.BadParameter(f"split must be train or heldout, not {split!r}", param_hint="--split")
        counts = (tasks, 0) if split == "train" else (0, tasks)
        chosen = generate_suite(suite, *counts, seed=seed, levels=level or None)
        policy = make_policy("hf", model, fewshot=fewshot, device=device)
        with Sandbox(workers=1, preload=[suite]) as sandbox:
            report = gold_step_probabilities(policy, ToolEnv(sandbox, max_steps=16), chosen)
        typer.echo(json.dumps({"model": policy.model_id, "suite": suite, "split": split, **report}, indent=1))

    app.add_typer(policy_app, name="policy")
