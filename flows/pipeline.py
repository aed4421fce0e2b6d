"""The pipeline flow: N rounds of generate -> derive -> export -> train -> evaluate, each round
searching with the checkpoint the last round trained (rStar-style self-evolution).

Run ids: `<run>/r0/eval` evaluates the starting model; round r writes its trees to `<run>/r<r>`
(and derives its datasets into the same run), trains checkpoints `<out>/checkpoints/r<r>-<kind>`
(each trainer from the last one's checkpoint), and evaluates the last of them as `<run>/r<r>/eval`.
Finished stages are kept in `<out>/journal.json` and not run again, and inside a stage work
already done is skipped (committed shards, checkpoints on disk), so a killed pipeline resumes at
the stage it reached. A curriculum sets the task levels each round searches; `round_settings`
changes engine settings from a given round on (e.g. the search objective or the DPO steps of
round 2) and `round_trainers` the trainers, so a run whose rounds differ is still one command.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

# PipelineConfig and round_engine live in the config tree; re-exported for the flow's callers.
from dataengine.config import FIXED_ACROSS_ROUNDS, EngineConfig, PipelineConfig, round_engine
from dataengine.stages.resources import release_policies
from dataengine.stages.train import DATASET
from flows.derived import derive_flow, export_flow
from flows.evaluate import evaluate_flow
from flows.generate import generate_flow
from flows.runtime import artifact_key, make_task_runner
from flows.train import train_dpo_flow, train_grpo_flow, train_sft_flow

TRAIN_FLOWS = {"dpo": train_dpo_flow, "sft": train_sft_flow, "grpo": train_grpo_flow}
__all__ = ["FIXED_ACROSS_ROUNDS", "PipelineConfig", "round_engine"]


def round_run(run_id: str, r: int) -> str:
    return f"{run_id}/r{r}"


def eval_run(run_id: str, r: int) -> str:
    return f"{run_id}/r{r}/eval"


def with_model(engine: EngineConfig, model: str, seed: int | None = None) -> EngineConfig:
    data = engine.model_dump()
    data["policy"]["model"] = model
    if seed is not None:
        data["seed"] = seed
    return EngineConfig.model_validate(data)


def greedy(results: list[dict[str, Any]]) -> dict[str, tuple[float, float, float]]:
    """suite -> greedy_success (value, ci_low, ci_high) of an evaluate flow's results."""
    return {r["suite"]: tuple(r["metrics"]["greedy_success"]) for r in results if "greedy_success" in r["metrics"]}


def success_table(evals: list[tuple[int, str, dict[str, tuple[float, float, float]]]]) -> str:
    """Markdown: one row per suite, one column per evaluated round (greedy success [95% CI])."""
    suites = sorted({s for _, _, g in evals for s in g})
    head = "| suite | " + " | ".join(f"round {r} ({Path(m).name if '/' in m else m})" for r, m, _ in evals) + " |"
    lines = [head, "|" + "---|" * (len(evals) + 1)]
    for s in suites:
        cells = []
        for _, _, g in evals:
            v = g.get(s)
            cells.append(f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" if v and v[1] is not None else (f"{v[0]:.2f}" if v else ""))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


class Journal:
    """Finished stages of a pipeline, kept in `<out_dir>/journal.json` (stage key -> result), so
    a killed pipeline resumes at the stage it reached without redoing finished ones. The file
    names the config it belongs to: a changed config is refused, not silently mixed in. The
    number of rounds is left out of that key (round r's stages do not depend on it), so a
    finished pipeline rerun with more rounds runs only the new ones. `seconds`: wall time over
    every call, each counted up to its last save (a killed call's unfinished stage is not)."""

    def __init__(self, path: Path, config: PipelineConfig) -> None:
        import json

        from dataengine.types import stable_hash

        self.path = path
        # Empty round_settings / round_trainers are left out too, so journals written before they
        # existed still match.
        left_out = {"runtime", "rounds"} | {k for k in ("round_settings", "round_trainers") if not getattr(config, k)}
        self.key = stable_hash(config.model_dump(mode="json", exclude=left_out))
        self.done: dict[str, Any] = {}
        self.forked_from: dict[str, Any] | None = None
        self.started = time.perf_counter()
        self.seconds_before = 0.0
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("config") != self.key:
                raise ValueError(f"{path} belongs to another pipeline config; use another out_dir or run id, "
                                 "or delete the journal to start over")
            self.done = saved["stages"]
            self.forked_from = saved.get("forked_from")
            self.seconds_before = saved.get("seconds", 0.0)

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def run(self, key: str, work: Any) -> Any:
        """The stored result of stage `key`, or `work()`'s, stored once it returns."""
        import json

        if key in self.done:
            return self.done[key]
        result = work()
        self.done[key] = json.loads(json.dumps(result, default=str))
        self.save()
        return self.done[key]

    def save(self) -> None:
        import json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        saved = {"config": self.key, "stages": self.done, "seconds": self.seconds}
        if self.forked_from is not None:
            saved["forked_from"] = self.forked_from
        tmp.write_text(json.dumps(saved, indent=1, sort_keys=True))
        tmp.replace(self.path)


def forked_from(out_dir: str | Path) -> dict[str, Any] | None:
    """The `forked_from` record of the pipeline journal in `out_dir` (None: not a fork, or no journal)."""
    import json

    path = Path(out_dir) / "journal.json"
    return json.loads(path.read_text()).get("forked_from") if path.is_file() else None


def fork_pipeline(source_out_dir: str | Path, source_store: str | Path, config: PipelineConfig, rounds: int) -> Journal:
    """Start `config`'s pipeline from the first `rounds` finished rounds of another: its store is
    copied to config.engine.store and its journal's stages r0..r`rounds` become the new
    journal's (marked `forked_from`), so only the later rounds run, under the new settings.
    Checkpoints stay where the source wrote them (the journal points at them). For ablations
    of later rounds without paying for the earlier ones again; the results table's first rounds
    are the source's, made under its settings. The new run id must differ from the source's
    (its later rounds' shards are in the copied store)."""
    import json
    import re
    import shutil

    from storage import Store

    source_out_dir, source_store = Path(source_out_dir), Path(source_store)
    source = source_out_dir / "journal.json"
    if not source.is_file():
        raise ValueError(f"cannot fork {source_out_dir}: no journal.json there (the pipeline's out_dir)")
    journal_path = Path(config.out_dir) / "journal.json"
    store = Path(config.engine.store)
    if journal_path.exists() or store.exists():
        raise ValueError(f"cannot fork into {config.out_dir}: {journal_path if journal_path.exists() else store} "
                         "exists; choose a new folder")
    saved = json.loads(source.read_text())
    stages = saved.get("stages", {})
    missing = [k for k in ["r0/evaluate"] + [f"r{r}/evaluate" for r in range(1, rounds + 1)] if k not in stages]
    if missing:
        raise ValueError(f"cannot fork {rounds} rounds of {source_out_dir}: unfinished stages {missing}")
    kept = {k: v for k, v in stages.items() if int(k.split("/", 1)[0][1:]) <= rounds}
    shutil.copytree(source_store, store)
    later = re.compile(re.escape(config.run_id) + r"/r(\d+)(/|$)")
    taken = [r for r in Store(store).runs().select("run_id").unique().collect()["run_id"].sort().to_list()
             if (m := later.match(r)) and int(m.group(1)) > rounds]
    if taken:
        shutil.rmtree(store)
        raise ValueError(f"cannot fork: run {taken[0]!r} is in {source_store} already; give the fork another run id "
                         "(--set run_id=NAME)")
    journal = Journal(journal_path, config)
    journal.done = kept
    journal.forked_from = {"out_dir": str(source_out_dir), "store": str(source_store), "rounds": rounds,
                           "config": saved.get("config")}
    journal.save()
    return journal


def round_trainers(config: PipelineConfig, r: int) -> list[str]:
    """The trainers round `r` runs: the latest round_trainers entry at or before r, else `trainers`."""
    started = [k for k in config.round_trainers if k <= r]
    return list(config.round_trainers[max(started)]) if started else list(config.trainers)


def round_levels(config: PipelineConfig, r: int) -> list[int] | None:
    """The task levels round `r` (1-based) searches: curriculum[r-1], the last entry after the
    list ends; None (every level) without a curriculum."""
    if not config.curriculum:
        return config.engine.levels
    return list(config.curriculum[min(r, len(config.curriculum)) - 1])


@flow(name="pipeline", flow_run_name="pipeline {config.run_id}", log_prints=False)
def pipeline_flow(config: PipelineConfig | None = None) -> dict[str, Any]:
    """Rounds of generate -> derive -> export -> train -> evaluate (module docstring); returns
    {run_id, store, rounds: [...], evals: [(round, model, {suite: greedy})], model, seconds}.
    Every stage's result goes to the journal in out_dir, so a rerun resumes where it stopped."""
    config = config or PipelineConfig()
    from storage import Store

    start = time.perf_counter()
    rt = config.runtime
    engine = config.engine
    store = engine.store
    out = Path(config.out_dir)
    journal = Journal(out / "journal.json", config)
    Store(store).record_run(config.run_id, kind="pipeline", config=config.model_dump(mode="json"), seed=engine.seed)

    def timed(work: Any) -> Any:
        def run() -> dict[str, Any]:
            began = time.perf_counter()
            result = work()
            return {"result": result, "seconds": time.perf_counter() - began}
        return run

    def evaluate(model: str, r: int) -> dict[str, Any]:
        return journal.run(f"r{r}/evaluate", timed(lambda: evaluate_flow.with_options(task_runner=make_task_runner(rt))(
            config=with_model(round_engine(config, r), model), run_id=eval_run(config.run_id, r), runtime=rt)))

    model = engine.policy.model
    evals = [(0, model, greedy(evaluate(model, 0)["result"]))]
    rounds = []
    for r in range(1, config.rounds + 1):
        run = round_run(config.run_id, r)
        this = round_engine(config, r)
        searched = with_model(this, model, seed=engine.seed + r - 1).model_copy(update={"levels": round_levels(config, r)})
        gen = journal.run(f"r{r}/generate", timed(lambda: generate_flow.with_options(task_runner=make_task_runner(rt))(
            config=searched, run_id=run, runtime=rt)))
        derived = journal.run(f"r{r}/derive", timed(lambda: derive_flow(
            store=store, run_ids=[run], out_run_id=run, kinds=list(config.derive), derive=this.derive, evaluation=this.eval)))
        exported = journal.run(f"r{r}/export", timed(lambda: export_flow(
            store=store, out_dir=str(out / "datasets" / f"r{r}"), run_ids=[run], balance_by=this.derive.balance_by,
            balance_kinds=list(this.derive.balance_kinds), decontaminate=this.derive.decontaminate,
            evaluation=this.eval)))["result"]
        checkpoints = []
        # The search policy is reloaded from the new checkpoint anyway; training needs its memory.
        release_policies()
        for kind in round_trainers(config, r):
            data = exported.get(DATASET[kind][1], {})
            if not data.get("rows"):
                get_run_logger().warning("round %d: no %s rows for %s; %s skipped", r, DATASET[kind][1], kind, kind)
                continue
            settings = this.train.for_kind(kind).replace(init=model, out_dir=str(out / "checkpoints" / f"r{r}-{kind}"),
                                                           run_id=run)
            trained = journal.run(f"r{r}/train-{kind}", timed(lambda: TRAIN_FLOWS[kind](
                data=data["path"], config=settings, store=store, accelerator_slots=rt.accelerator_slots)))
            info = trained["result"]
            moved = info["metrics"].get("weights_changed", True)
            checkpoints.append({**{k: info[k] for k in ("model_id", "parent_id", "path", "kind", "resumed")},
                                "weights_changed": moved, "rows": data["rows"], "seconds": trained["seconds"],
                                "metrics": {k: v for k, v in info["metrics"].items() if not isinstance(v, dict)}})
            if not moved:
                get_run_logger().warning("round %d: %s did not change the weights; the next stage starts from %s",
                                         r, kind, model)
                continue
            model = info["path"]
        evaluated = evaluate(model, r)
        evals.append((r, model, greedy(evaluated["result"])))
        rounds.append({"round": r, "run_id": run, "levels": searched.levels, "generate": gen["result"],
                       "derived": derived["result"], "exported": exported, "checkpoints": checkpoints,
                       "evaluate": evaluated["result"],
                       "seconds": {"generate": gen["seconds"], "derive": derived["seconds"],
                                   "evaluate": evaluated["seconds"]}})
    table = success_table(evals)
    create_markdown_artifact(
        key=artifact_key("pipeline", config.run_id),
        markdown=f"# pipeline `{config.run_id}`\n\nstore: `{store}`; final model: `{model}`\n\n"
                 f"Greedy success on held-out tasks (95% Wilson interval):\n\n{table}",
    )
    return {"run_id": config.run_id, "store": store, "out_dir": str(out), "rounds": rounds, "evals": evals,
            "baseline": evaluate(engine.policy.model, 0)["result"], "model": model, "table": table,
            "forked_from": journal.forked_from,
            "seconds": time.perf_counter() - start, "journal_seconds": journal.seconds}


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Run the pipeline flow (on the embedded ephemeral API unless PREFECT_API_URL is set)."""
    return pipeline_flow(config=config)
