"""`dataengine demo`: the main job on the embedded defaults."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Path = typer.Option(Path("demo-out"), "--out", help="Folder for task files and results."),
        tasks: int = typer.Option(20, "--tasks", min=1, help="Gold episodes per suite."),
        seed: int = typer.Option(0, "--seed", help="Seed of task generation."),
    ) -> None:
        """Generate the built-in suites and run scripted gold episodes through the sandboxed ToolEnv."""
        from rich.console import Console
        from rich.table import Table

        from dataengine.env import ToolEnv
        from dataengine.gold_demo import run_gold
        from dataengine.suites import generate_suite, list_suites, save_tasks
        from dataengine.tools.sandbox import Sandbox

        console = Console()
        out.mkdir(parents=True, exist_ok=True)
        suites = list_suites()
        for name in suites:
            path = save_tasks(generate_suite(name, n_train=1000, n_heldout=200, seed=seed), out / f"{name}.jsonl")
            console.print(f"wrote 1000 train + 200 held-out {name} tasks to {path}")
        table = Table("suite", "episodes", "tool calls", "tool errors", "gold success",
                      "corrupted: success", "seconds", title="Scripted gold episodes (sandboxed ToolEnv)")
        with Sandbox(workers=2, preload=suites) as sandbox:
            env = ToolEnv(sandbox, max_steps=8)
            for name in suites:
                s = run_gold(env, name, tasks, seed=seed)
                table.add_row(name, str(s.tasks), str(s.tool_calls), str(s.tool_errors),
                              f"{s.gold_success}/{s.tasks}", f"{s.corrupted_success}/{s.corrupted}",
                              f"{s.seconds:.1f}")
        console.print(table)
