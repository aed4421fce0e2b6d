"""`dataengine verify bfcl ...` (check prediction files), `dataengine verify tau2` (reward parity with
tau2's evaluator) and `dataengine verifiers report` (calibration)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dataengine.commands.common import fail as _fail


def register(app: typer.Typer) -> None:
    verify_app = typer.Typer(help="Check model predictions against external benchmarks.", no_args_is_help=True)

    @verify_app.command("bfcl")
    def bfcl_command(
        category: str = typer.Option(..., "--category", help="BFCL category, e.g. simple, parallel, live_multiple, multi_turn_base."),
        predictions: Path = typer.Option(..., "--predictions", help='JSONL: {"id": ..., "calls": [{"name": ..., "arguments": {...}}]} per line; multi-turn: {"id": ..., "turns": [[call, ...], ...]}, one list per user turn.'),
        out: Path | None = typer.Option(None, "--out", help="Write one {id, valid, reason} per prediction, then per task with no prediction, here (default: stdout)."),
    ) -> None:
        """Check predictions with BFCL's rules (AST semantics; multi-turn: state and results after each turn) and print a summary.

        Scored per task: each id at most once, and tasks with no prediction count as failures.
        """
        from dataengine.external import MissingPackageError, bfcl

        try:
            name = bfcl.canonical_category(category)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--category") from None
        try:
            rows = bfcl.read_predictions(predictions, name)
            results, summary = bfcl.score_predictions(name, rows)
        except (bfcl.PredictionError, MissingPackageError) as exc:
            _fail(str(exc))
        lines = [json.dumps(r, ensure_ascii=False) for r in results]
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        else:
            for line in lines:
                typer.echo(line)
        typer.echo(
            f"bfcl {name}: predicted {summary['predicted']} of {summary['tasks']} tasks, {summary['valid']} valid; "
            f"accuracy {summary['accuracy']:.4f} over all {summary['tasks']} tasks "
            f"({summary['missing_tasks']} with no prediction count as failures)",
            err=True,
        )
        typer.echo(json.dumps({"summary": summary}))

    verify_app.command("tau2")(tau2_command)
    app.add_typer(verify_app, name="verify")

    verifiers_app = typer.Typer(help="Rule-based verifiers and the composite reward.", no_args_is_help=True)

    @verifiers_app.command("report")
    def report_command(
        per_suite: int = typer.Option(10, "--per-suite", min=1, help="Tasks per built-in suite and per BFCL category."),
        external: bool = typer.Option(True, "--external/--no-external", help="Include BFCL and tau2 when installed."),
        tau2_tasks: int = typer.Option(1, "--tau2-tasks", min=0, help="tau2 tasks per domain (each replays a 3-7 MB database)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the built-in suites' tasks."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the rows as JSON here."),
        judge: str | None = typer.Option(None, "--judge", help="Also calibrate an LLM judge on this model (e.g. smollm2) against the success labels."),
        judge_limit: int = typer.Option(40, "--judge-limit", min=1, help="Episodes the judge grades (one forward pass each)."),
    ) -> None:
        """Run every verifier on gold and perturbed episodes; print agreement, precision and recall."""
        from rich.console import Console
        from rich.table import Table

        from dataengine.verifiers.report import calibrate, calibration_set

        examples = calibration_set(per_suite=per_suite, external=external, tau2_tasks=tau2_tasks, seed=seed)
        judges = []
        if judge is not None:
            from dataengine.policy import make_policy
            from dataengine.verifiers.model_based import LLMJudge

            judges.append(LLMJudge(make_policy("hf", judge)))
        rows = calibrate(examples, judges=judges, judge_limit=judge_limit)
        sources = sorted({e.source for e in examples})
        table = Table("verifier", "n", "agreement", "precision(pass)", "recall(pass)", "n/a", "disagreements by kind",
                      title=f"{len(examples)} labelled episodes from {len(sources)} suites")
        fmt = lambda x: "-" if x is None else f"{x:.3f}"
        for r in rows:
            table.add_row(
                r["verifier"], str(r["n"]), fmt(r["agreement"]), fmt(r["precision"]), fmt(r["recall"]), str(r["n_missing"]),
                ", ".join(f"{k}={v}" for k, v in r["disagreements"].items()) or "",
            )
        Console().print(table)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps({"sources": sources, "examples": len(examples), "rows": rows}, indent=2), encoding="utf-8")

    app.add_typer(verifiers_app, name="verifiers")


def tau2_command(
    domain: list[str] = typer.Option(["retail", "airline"], "--domain", help="tau2 domain (repeatable): retail, airline."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N tasks of each domain."),
    ids: list[str] | None = typer.Option(None, "--id", help="Only these tau2 task ids (repeatable)."),
    kind: list[str] | None = typer.Option(None, "--kind", help="Trajectory kinds (repeatable): gold, drop_write, wrong_arg, missing_info, extra_write, repeat_write (default: all)."),
    out: Path | None = typer.Option(None, "--out", help="Write one JSON row per trajectory here (ours and tau2's reward and components)."),
) -> None:
    """Score gold and perturbed trajectories of every tau2 task with our reward and with the installed
    tau2 package's evaluator; print the agreement per domain and kind. Exits 1 on any disagreement."""
    from dataengine.external import MissingPackageError
    from dataengine.external.tau2 import DOMAINS

    bad = [d for d in domain if d not in DOMAINS]
    if bad:
        raise typer.BadParameter(f"unknown tau2 domain(s) {bad}; supported: {', '.join(DOMAINS)}", param_hint="--domain")
    try:
        from dataengine.external.tau2 import parity

        results = {d: parity.parity(d, limit=limit, ids=ids or None, kinds=kind or parity.KINDS) for d in domain}
    except (MissingPackageError, ValueError) as exc:
        _fail(str(exc))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for rows, _ in results.values():
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    disagree = []
    for d, (rows, summary) in results.items():
        for k, s in summary.items():
            typer.echo(f"tau2 {d} {k}: {s['agree']}/{s['n']} agree (reward 1: ours {s['ours_pass']}, tau2 {s['tau2_pass']})")
        disagree += [f"{r['id']} {r['kind']}" for r in rows if not r["agree"]]
    typer.echo(json.dumps({"summary": {d: s for d, (_, s) in results.items()}, "disagreements": disagree}))
    if disagree:
        _fail(f"{len(disagree)} trajectories where our tau2 reward and tau2's evaluator disagree: {', '.join(disagree[:10])}")
