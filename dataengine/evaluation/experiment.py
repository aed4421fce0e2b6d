"""Self-improvement experiments: the pipeline (`PipelineConfig`, run by flows/pipeline.py) with the settings results are
made with, and the per-round, per-stage table it reports.

`experiment_config` builds a PipelineConfig: R rounds of search with the current checkpoint on
train tasks (a curriculum of levels), derive, chained training (rejection-sampling SFT, then
step DPO, then online GRPO on prompts whose pass rate is strictly between 0 and 1, each stage
from the previous checkpoint), evaluation on held-out tasks (greedy, and search at inference
twice: deployable and oracle-guided). `results_rows` / `results_markdown` turn the pipeline's
result into the table docs/results.md shows; `plot_success` draws success per round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AXES = ("when", "which", "how", "final")


def experiment_config(*, out: str, suites: list[str], rounds: int = 3, train_tasks: int = 32, heldout_tasks: int = 100,
                      model: str = "smollm2", curriculum: list[list[int]] | None = None,
                      trainers: list[str] | None = None, seed: int = 0, overrides: dict[str, Any] | None = None) -> Any:
    """The PipelineConfig of an experiment; `overrides` are dotted load_config overrides
    (e.g. {"engine__search__num_simulations": 8})."""
    from dataengine.config import PipelineConfig, load_config

    base: dict[str, Any] = {
        "run_id": "experiment",
        "rounds": rounds,
        "trainers": trainers or ["sft", "dpo", "grpo"],
        "curriculum": curriculum or [],
        "out_dir": str(Path(out) / "pipeline"),
        "engine__store": str(Path(out) / "store"),
        "engine__seed": seed,
        "engine__suites": list(suites),
        "engine__num_tasks": train_tasks,
        "engine__policy__model": model,
        "engine__policy__temperature": 0.7,
        "engine__eval__num_tasks": heldout_tasks,
        "engine__eval__seed": seed,
        "engine__eval__search": True,
    }
    base.update(overrides or {})
    config = load_config(None, model=PipelineConfig, **base)
    from dataengine.config import ConfigError
    from dataengine.suites.catalog import is_eval_only

    for suite in config.engine.suites:
        if is_eval_only(suite):
            raise ConfigError(f"engine.suites: {suite!r} is eval-only and the experiment searches and trains on its "
                              f"suites; train on another suite and evaluate on it with --eval-suite {suite}")
    return config


def _metric(result: dict[str, Any], name: str) -> tuple[Any, Any, Any] | None:
    value = result["metrics"].get(name)
    return tuple(value) if value is not None else None


def _cell(value: tuple[Any, Any, Any] | None) -> str:
    if value is None or value[0] is None:
        return "-"
    if value[1] is None:
        return f"{value[0]:.2f}"
    return f"{value[0]:.2f} [{value[1]:.2f}, {value[2]:.2f}]"


def results_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (round, suite): what the round searched and trained, and the held-out
    metrics of the model it ended with (round 0: the base model)."""
    rows = []
    rounds = [{"round": 0, "evaluate": result["baseline"], "checkpoints": [], "generate": None, "derived": [],
               "seconds": {}, "levels": None}] + list(result["rounds"])
    for rnd in rounds:
        gen = rnd["generate"] or {}
        # Every shard of the round's run: those a killed call committed come back skipped, with their counts.
        shards = gen.get("shards", [])
        derived = {d["kind"]: d["rows"] for d in rnd["derived"]}
        trained = ", ".join(f"{c['kind']} ({c['rows']} rows{'' if c.get('weights_changed', True) else ', no change'})"
                            for c in rnd["checkpoints"]) or "-"
        for suite_result in rnd["evaluate"]:
            rows.append({
                "round": rnd["round"],
                "suite": suite_result["suite"],
                "levels": rnd.get("levels"),
                "trees": sum(s.get("trees", 0) for s in shards),
                "successes_found": sum(s.get("successes", 0) for s in shards),
                "solved_found": sum(s.get("solved", 0) for s in shards),
                "generated_tokens": sum(s.get("generated_tokens", 0) for s in shards),
                "rows": derived,
                "trained": trained,
                "seconds": {k: round(v, 1) for k, v in rnd["seconds"].items()}
                           | {f"train-{c['kind']}": round(c["seconds"], 1) for c in rnd["checkpoints"]},
                "model_id": suite_result["model_id"],
                "greedy": _metric(suite_result, "greedy_success"),
                "axes": {a: _metric(suite_result, f"axis/{a}") for a in AXES},
                "by_level": {name.split("/", 1)[1]: _metric(suite_result, name)
                             for name in sorted(suite_result["metrics"]) if name.startswith("level/")},
                "search_deployable": _metric(suite_result, "search_deployable_success"),
                "search_oracle": _metric(suite_result, "search_success"),
                "search_found": _metric(suite_result, "search_found"),
                "n": suite_result.get("n", {}).get("greedy_success"),
            })
    return rows


def results_markdown(rows: list[dict[str, Any]], *, command: str, seconds: float, total_seconds: float | None = None) -> str:
    """The per-round table, then the per-round search and training details. total_seconds: wall
    time over every call of a resumed experiment (the journal's)."""
    wall = f"wall time {seconds / 60:.1f} min"
    if total_seconds is not None and total_seconds - seconds >= 1:
        wall += (f" in this call, {total_seconds / 60:.1f} min over every call (a killed call counted to its last "
                 "finished stage)")
    lines = [
        f"Command: `{command}`; {wall}.", "",
        "| round | suite | greedy success [95% CI] | greedy by level | when | which | how | final | search, deployable | "
        "search, oracle-guided | any success in tree (oracle bound) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        axes = [_cell(r["axes"][a]) for a in AXES]
        by_level = "; ".join(f"{lv}: {_cell(v)}" for lv, v in r.get("by_level", {}).items()) or "-"
        lines.append(f"| {r['round']} | {r['suite']} | {_cell(r['greedy'])} | {by_level} | " + " | ".join(axes)
                     + f" | {_cell(r['search_deployable'])} | {_cell(r['search_oracle'])} | {_cell(r['search_found'])} |")
    lines += ["", "| round | levels | trees searched | successes (tasks solved) | generated tokens | "
              "rows per dataset | trained (from the previous checkpoint) | seconds per stage |",
              "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in rows:
        if r["round"] in seen or r["round"] == 0:
            continue
        seen.add(r["round"])
        datasets = ", ".join(f"{k} {v}" for k, v in r["rows"].items()) or "-"
        stages = ", ".join(f"{k} {v}" for k, v in r["seconds"].items())
        lines.append(f"| {r['round']} | {r['levels'] or 'all'} | {r['trees']} | {r['successes_found']} "
                     f"({r['solved_found']}) | {r['generated_tokens']} | {datasets} | {r['trained']} | {stages} |")
    return "\n".join(lines)


def plot_success(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Held-out greedy success per round and suite with 95% intervals, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for suite in sorted({r["suite"] for r in rows}):
        points = [(r["round"], r["greedy"]) for r in rows if r["suite"] == suite and r["greedy"]]
        xs = [p[0] for p in points]
        ys = [p[1][0] for p in points]
        low = [p[1][0] - (p[1][1] if p[1][1] is not None else p[1][0]) for p in points]
        high = [(p[1][2] if p[1][2] is not None else p[1][0]) - p[1][0] for p in points]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=suite)
    ax.set_xlabel("round")
    ax.set_ylabel("held-out greedy success")
    ax.set_ylim(0, 1)
    ax.set_xticks(sorted({r["round"] for r in rows}))
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(result: dict[str, Any], out: str | Path, *, command: str) -> dict[str, Path]:
    """results.md, results.json and success.png under `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = results_rows(result)
    total = result.get("journal_seconds")
    (out / "results.json").write_text(json.dumps({"command": command, "seconds": result["seconds"],
                                                  "journal_seconds": total, "rows": rows}, indent=1, default=str))
    text = results_markdown(rows, command=command, seconds=result["seconds"], total_seconds=total)
    fork = result.get("forked_from")
    if fork:
        text = (f"Rounds 0-{fork['rounds']} are those of the experiment in {fork['out_dir']} (forked: made under its "
                f"settings, journal config {fork['config']}); later rounds ran here.\n\n{text}")
    (out / "results.md").write_text(text + "\n")
    return {"markdown": out / "results.md", "json": out / "results.json", "plot": plot_success(rows, out / "success.png")}
