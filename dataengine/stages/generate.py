"""The generate stage: which tasks, which shards, which run id, and one shard searched (or
sampled) and committed.

    plan = plan_generate(config)                       # run id, settings key + shards
    todo = plan.todo(store)
    plan.check_resume(store)                           # a run id holds one configuration
    record_generate_run(store, config, plan, ...)      # before the first shard commits
    results = execute(config, plan, store, todo)       # generate_shard per shard
    record_generate_run(store, config, plan, model_id=results[0].model_id, ...)

`generate` is that driver, the only one: `dataengine generate` hands it `in_process()` (the
shards one after another here), the generate flow an executor of Prefect tasks, each running
`generate_shard_at` on threads or Ray. A shard's seed is config.seed + 1000 * index either
way, so the CLI and the flow write the same trees.

Per shard: one Delta transaction per table, in the order nodes, trajectories, tasks; the `tasks`
rows mark the shard committed, so a rerun with the same run id skips it. The run's `runs` row
holds its settings key (`settings_key`): resuming a run id that already has committed shards
with other settings (an explicit `--run-id`, a pipeline round) is refused, so one run never
mixes trees of two configurations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dataengine.config import EngineConfig
from dataengine.stages.resources import Resources
from dataengine.types import Task, stable_hash

SHARD_SEED_STRIDE = 1_000


@dataclass(frozen=True)
class Shard:
    """index: position in the run; shard_id: the task index range ("tasks-000000-000003")."""

    index: int
    shard_id: str
    tasks: list[Task]


@dataclass
class GeneratePlan:
    """The run id, the settings key (`settings_key`) and the shards of one generate run."""

    run_id: str
    shards: list[Shard]
    settings_key: str

    @property
    def toolboxes(self) -> list[str]:
        return sorted({t.toolbox for s in self.shards for t in s.tasks})

    def todo(self, store: Any) -> list[Shard]:
        """The shards not yet committed in `store`."""
        committed = store.committed_shards("tasks", self.run_id)
        return [s for s in self.shards if s.shard_id not in committed]

    def check_resume(self, store: Any) -> None:
        """Refuse to resume a run whose committed shards were written with other settings (its
        `runs` row holds another settings key; runs recorded before keys existed pass) or hold
        other tasks than this plan's shards of the same id (another task list: the shard would be
        skipped and its tasks never searched)."""
        import polars as pl

        from storage.errors import StoreError

        if not store.has_table("tasks"):
            return
        held = (store.scan("tasks").filter(pl.col("run_id") == self.run_id).group_by("shard_id")
                .agg(pl.col("task_id").unique().sort()).collect())
        if not held.height:
            return
        stored = recorded_settings_key(store, self.run_id)
        if stored is not None and stored != self.settings_key:
            raise StoreError(
                f"run {self.run_id!r} was written with other settings (settings key {stored}, now {self.settings_key}): "
                "a changed search, policy, sampling, value-model, suite or prompt setting would mix two "
                "configurations in one run; use another run id (or the default one, which follows the settings) "
                "or delete that run")
        planned = {s.shard_id: sorted(t.id for t in s.tasks) for s in self.shards}
        for shard_id, task_ids in held.iter_rows():
            if shard_id in planned and planned[shard_id] != task_ids:
                raise StoreError(
                    f"shard {shard_id!r} of run {self.run_id!r} holds tasks {task_ids[:3]}..., this run's shard of "
                    f"that id {planned[shard_id][:3]}...: the run was written over another task list; use another "
                    "run id instead of mixing two task lists")


@dataclass
class ShardResult:
    """What one shard produced (counts; the rows are in the store)."""

    shard_id: str
    skipped: bool = False
    trees: int = 0
    simulations: int = 0
    nodes: int = 0
    trajectories: int = 0
    successes: int = 0
    solved_task_ids: list[str] = field(default_factory=list)
    generated_tokens: int = 0
    task_tokens: dict[str, int] = field(default_factory=dict)
    env_seconds: float = 0.0
    verify_seconds: float = 0.0
    store_seconds: float = 0.0
    seconds: float = 0.0
    model_seconds: float = 0.0
    model_id: str | None = None
    verifier_versions: dict[str, str] | None = None
    node: dict[str, Any] | None = None

    @property
    def solved(self) -> int:
        return len(self.solved_task_ids)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "solved": self.solved}


@dataclass
class GenerateSummary:
    """A generation run, as flows and the CLI print it.

    trees: tasks searched (or sampled) in this call; simulations: MCTS simulations backed up
    (0 for baselines); successes: successful trajectories; solved: tasks with at least one;
    seconds: wall time of this call; model_seconds: time inside the policy (sampling, scoring);
    env_seconds / verify_seconds / store_seconds: time in env steps (sandboxed tool calls),
    terminal verifiers and store writes. The totals count this call's shards; `shards` holds
    every shard of the run in order, those committed by an earlier call with skipped=True and
    their counts read back from the store (`committed_shard_counts`).
    """

    run_id: str
    method: str
    store: str | None
    trees: int = 0
    simulations: int = 0
    nodes: int = 0
    trajectories: int = 0
    successes: int = 0
    solved: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    model_seconds: float = 0.0
    env_seconds: float = 0.0
    verify_seconds: float = 0.0
    store_seconds: float = 0.0
    shards_written: int = 0
    shards_skipped: int = 0
    solved_task_ids: list[str] = field(default_factory=list)
    task_tokens: dict[str, int] = field(default_factory=dict)
    shards: list[ShardResult] = field(default_factory=list)

    @property
    def successes_per_million_tokens(self) -> float:
        return 1e6 * self.successes / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def outside_model_share(self) -> float:
        """Share of wall time spent outside the policy (env, verifiers, search core, store)."""
        return 1.0 - self.model_seconds / self.seconds if self.seconds > 0 else 0.0

    def add(self, shard: ShardResult) -> None:
        if shard.skipped:
            self.shards_skipped += 1
            return
        self.shards_written += 1
        for name in ("trees", "simulations", "nodes", "trajectories", "successes", "generated_tokens",
                     "env_seconds", "verify_seconds", "store_seconds"):
            setattr(self, name, getattr(self, name) + getattr(shard, name))
        self.solved += shard.solved
        self.solved_task_ids += shard.solved_task_ids
        self.task_tokens.update(shard.task_tokens)
        self.model_seconds += shard.model_seconds

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("solved_task_ids", "task_tokens", "shards"):
            out.pop(name)
        out["successes_per_million_tokens"] = round(self.successes_per_million_tokens, 1)
        out["outside_model_share"] = round(self.outside_model_share, 4)
        return out


# ---------------------------------------------------------------------------- plan


def config_tasks(config: EngineConfig) -> list[Task]:
    """The tasks of a config: config.task_file's tasks of config.split (at most num_tasks when
    set), else config.num_tasks tasks of each suite in config.suites, seeded by config.seed
    (`suites.catalog.suite_tasks`: an eval-only suite such as bfcl:<category> only with split
    heldout; its tasks keep split "heldout" in the store)."""
    from dataengine.suites import load_tasks
    from dataengine.suites.catalog import suite_tasks

    if config.tools.mcp:  # task files may name the servers' toolboxes
        from dataengine.tools.mcp import register_servers

        register_servers(config.tools.mcp, config.sandbox)
    if config.task_file is not None:
        tasks = [t for t in load_tasks(config.task_file, tools=config.tools.modules) if t.split == config.split]
        if not tasks:
            raise ValueError(f"task file {config.task_file} holds no {config.split} tasks")
        return tasks[: config.num_tasks]
    tasks: list[Task] = []
    for suite in config.suites:
        tasks += suite_tasks(suite, config.num_tasks, split=config.split, seed=config.seed, levels=config.levels)
    return tasks


def shards(tasks: Sequence[Task], shard_size: int) -> list[Shard]:
    """The shards of `tasks` in order; shard_id names the task index range."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out = []
    for index, start in enumerate(range(0, len(tasks), shard_size)):
        part = list(tasks[start : start + shard_size])
        out.append(Shard(index, f"tasks-{start:06d}-{start + len(part) - 1:06d}", part))
    return out


def _output_settings(config: EngineConfig) -> dict[str, Any]:
    """Every setting that changes the output (`EngineConfig.output_settings`: method, n,
    rollouts, prior, search, policy, ...), the value head's bytes, the prompt template and, for a
    checkpoint folder, its weights' hash (a folder retrained in place must not resume old runs)
    and, with config.tools.modules, the hash of each tools entry's source."""
    from dataengine.chat_template import prompt_fingerprint
    from dataengine.models import checkpoint_hash, is_builtin

    value_model = config.generate.value_model
    settings = {
        "config": config.output_settings(),
        "value_model": _file_hash(value_model) if value_model else None,
        "prompt": prompt_fingerprint(config.policy.few_shot),
    }
    if not is_builtin(config.policy.model) and Path(config.policy.model).is_dir():
        settings["weights"] = checkpoint_hash(config.policy.model)
    if config.tools.modules:  # an edited tools file writes other trees
        from dataengine.tools.registry import tools_fingerprint

        settings["tools"] = tools_fingerprint(config.tools.modules)
    return settings


def settings_key(config: EngineConfig) -> str:
    """The hash a run's shards must agree on: `_output_settings` less the number of tasks (a run
    may be extended by more tasks; `check_resume` and `check_no_overlap` guard the task layout)."""
    settings = _output_settings(config)
    settings["config"].pop("num_tasks", None)
    return stable_hash(settings)


def default_run_id(config: EngineConfig, tasks: Sequence[Task]) -> str:
    """A run id fixed by `_output_settings` and the tasks: the same command resumes, any
    changed setting starts a new run."""
    key = stable_hash({**_output_settings(config), "tasks": [t.id for t in tasks]})
    return f"generate-{config.generate.method}-{key[:10]}"


def _file_hash(path: str) -> str:
    import hashlib

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"generate.value_model: {path} is not a file (fit one with `dataengine train value`)")
    return hashlib.sha256(file.read_bytes()).hexdigest()[:16]


def plan_generate(config: EngineConfig, *, tasks: Sequence[Task] | None = None, run_id: str | None = None) -> GeneratePlan:
    """The run id (default: `default_run_id`) and shards of a generate run over `tasks`
    (default: `config_tasks(config)`)."""
    tasks = list(tasks) if tasks is not None else config_tasks(config)
    if not tasks:
        raise ValueError("no tasks to generate from (config.num_tasks or the task list is empty)")
    return GeneratePlan(run_id or default_run_id(config, tasks), shards(tasks, config.shard_size), settings_key(config))


# ---------------------------------------------------------------------------- the stage


def record_generate_run(store: Any, config: EngineConfig, plan: GeneratePlan, *, model_id: str | None,
                        verifier_versions: dict[str, str] | None) -> None:
    """The run's lineage row: config and settings key, code version, model and checkpoint hash,
    verifier versions, seed and the store's table versions. Rewritten (one row per run) each time
    the run writes shards; the generate flow writes it before its shards without the model id,
    which the shards' processes know, then again after them with it."""
    store.record_run(
        plan.run_id,
        kind="generate",
        config={"engine": config.model_dump(mode="json"), "settings_key": plan.settings_key},
        model_id=model_id,
        checkpoint_hash=model_id.rsplit("@", 1)[-1] if model_id and "@" in model_id else None,
        verifier_versions=verifier_versions,
        seed=config.seed,
        source_versions=store.table_versions(),
    )


def recorded_settings_key(store: Any, run_id: str) -> str | None:
    """The settings key in the `runs` row of generate run `run_id` (None: no row, or a row
    written before keys were recorded)."""
    import json

    import polars as pl

    if not store.has_table("runs"):
        return None
    rows = (store.scan("runs").filter((pl.col("run_id") == run_id) & (pl.col("kind") == "generate"))
            .select("config_json").collect())
    keys = {json.loads(c).get("settings_key") for c in rows["config_json"].to_list() if c}
    keys.discard(None)
    return min(keys) if keys else None


def check_no_overlap(store: Any, run_id: str, shard: Shard) -> None:
    """Refuse to write `shard` into `run_id` when another shard of that run already holds one
    of its tasks: the run was started with another shard size or task list (or another
    process writes it), and the store would hold two trees of one task."""
    import polars as pl

    from storage.errors import StoreError

    if not store.has_table("tasks"):
        return
    ids = [t.id for t in shard.tasks]
    clash = (store.scan("tasks")
             .filter((pl.col("run_id") == run_id) & (pl.col("shard_id") != shard.shard_id) & pl.col("task_id").is_in(ids))
             .select("shard_id", "task_id").unique().sort("task_id").collect())
    if clash.height:
        first = clash.row(0, named=True)
        raise StoreError(
            f"run {run_id!r} already holds task {first['task_id']!r} (and {clash.height - 1} more of shard "
            f"{shard.shard_id!r}) in shard {first['shard_id']!r}: it was written with another shard size or task "
            "list, or by another process; use another run id (or delete that run) instead of mixing two layouts")


def committed_shard_counts(store: Any, run_id: str) -> dict[str, ShardResult]:
    """The committed shards of `run_id` (skipped=True), their counts read back from the store in
    one pass per table, so a resumed run's totals include what earlier calls wrote: trees, nodes,
    trajectories, successes, solved tasks and generated tokens (0 for shards written before tasks
    rows carried them); simulations and seconds are not stored and stay 0."""
    import polars as pl

    def per_shard(table: str, *aggs: pl.Expr) -> dict[str, dict[str, Any]]:
        if not store.has_table(table):
            return {}
        frame = store.scan(table).filter(pl.col("run_id") == run_id).group_by("shard_id").agg(*aggs).collect()
        return {row.pop("shard_id"): row for row in frame.iter_rows(named=True)}

    won = pl.col("success").fill_null(False)
    tasks = per_shard("tasks", pl.len().alias("trees"), pl.col("generated_tokens").fill_null(0).sum().alias("tokens"))
    nodes = per_shard("nodes", pl.len().alias("nodes"))
    trajs = per_shard("trajectories", pl.len().alias("trajectories"), won.sum().alias("successes"),
                      pl.col("task_id").filter(won).unique().sort().alias("solved"))
    out = {}
    for shard_id, t in tasks.items():
        tr = trajs.get(shard_id, {})
        out[shard_id] = ShardResult(shard_id, skipped=True, trees=t["trees"], nodes=nodes.get(shard_id, {}).get("nodes", 0),
                                    trajectories=tr.get("trajectories", 0), successes=int(tr.get("successes", 0)),
                                    solved_task_ids=list(tr.get("solved", [])), generated_tokens=int(t["tokens"]))
    return out


def generate_shard(resources: Resources, run_id: str, shard: Shard, *,
                   on_progress: Callable[[dict[str, int]], None] | None = None) -> ShardResult:
    """Search (or sample) one shard with config.generate's method and commit it; skipped when
    the shard is already committed for `run_id`."""
    from dataengine.search.run import run_shard, write_shard

    start = time.perf_counter()
    store, config = resources.store, resources.config
    if shard.shard_id in store.committed_shards("tasks", run_id):
        return ShardResult(shard.shard_id, skipped=True)
    check_no_overlap(store, run_id, shard)
    g = config.generate
    policy = resources.policy
    model_before = policy.stats.seconds
    out = run_shard(shard.shard_id, shard.tasks, method=g.method, policy=policy, env=resources.env,
                    reward=resources.reward, config=config, seed=config.seed + SHARD_SEED_STRIDE * shard.index,
                    n=g.n, prior=g.prior, rollouts=g.rollouts, value_model=resources.value_model,
                    on_progress=on_progress)
    written = time.perf_counter()
    check_no_overlap(store, run_id, shard)  # again: another process may have committed meanwhile
    write_shard(store, out, run_id)
    return ShardResult(
        shard.shard_id,
        trees=len(shard.tasks),
        simulations=out.simulations,
        nodes=len(out.nodes),
        trajectories=len(out.trajectories),
        successes=sum(bool(t["success"]) for t in out.trajectories),
        solved_task_ids=sorted({t["task_id"] for t in out.trajectories if t["success"]}),
        generated_tokens=out.generated_tokens,
        task_tokens=out.task_tokens,
        env_seconds=out.env_seconds,
        verify_seconds=out.verify_seconds,
        store_seconds=time.perf_counter() - written,
        seconds=time.perf_counter() - start,
        model_seconds=policy.stats.seconds - model_before,
        model_id=policy.model_id,
        verifier_versions=resources.reward.versions(),
    )


def generate_shard_at(config: EngineConfig, run_id: str, index: int, *,
                      slot: Callable[[], AbstractContextManager[Any]] = nullcontext,
                      log: Callable[[str], None] | None = None) -> ShardResult:
    """Shard `index` of `config`'s generate run `run_id`, with the policy and sandbox this
    process keeps (`shared_resources`): what one flow task runs. Skipped (skipped=True, no
    counts) when committed; otherwise searched inside `slot()` (the flows' accelerator slot),
    its progress as log lines through `log`."""
    from dataengine.stages.progress import Progress
    from dataengine.stages.resources import open_store, shared_resources

    plan = plan_generate(config, run_id=run_id)
    if not 0 <= index < len(plan.shards):
        raise ValueError(f"shard index {index} out of range: the config has {len(plan.shards)} shard(s)")
    shard = plan.shards[index]
    if shard.shard_id in open_store(config.store).committed_shards("tasks", run_id):
        return ShardResult(shard.shard_id, skipped=True)
    with slot():
        res = shared_resources(config, plan.toolboxes)
        label = f"{config.generate.method} shard {index}"
        with Progress(len(shard.tasks), label, terminal=False, log=log) as bar:
            return generate_shard(res, run_id, shard, on_progress=bar.update)


# A shard executor runs the shards a driver hands it and returns their results in order:
# `in_process` (the CLI: one after another here), or Prefect tasks on threads or Ray (flows/).
GenerateExecutor = Callable[[EngineConfig, GeneratePlan, Any, list[Shard]], list[ShardResult]]


def in_process(*, policy: Any = None, env: Any = None, progress: bool = True) -> GenerateExecutor:
    """The serial executor: the shards one after another in this process, with one Resources
    (`policy` / `env` used when given, else built from the config) and one progress bar."""
    from dataengine.stages.progress import Progress

    def execute(config: EngineConfig, plan: GeneratePlan, store: Any, todo: list[Shard]) -> list[ShardResult]:
        results = []
        with Resources.open(config, plan.toolboxes, policy=policy, env=env, store=store) as res, \
                Progress(sum(len(s.tasks) for s in todo), config.generate.method, enabled=progress) as bar:
            for shard in todo:
                results.append(generate_shard(res, plan.run_id, shard, on_progress=bar.update))
                bar.finish_shard()
        return results

    return execute


def generate(config: EngineConfig, *, tasks: Sequence[Task] | None = None, run_id: str | None = None,
             store: Any = None, policy: Any = None, env: Any = None, progress: bool = True,
             execute: GenerateExecutor | None = None) -> GenerateSummary:
    """Every shard of a generate run not yet committed, through `execute` (default
    `in_process(policy=, env=, progress=)`: `dataengine generate`; the generate flow passes
    Prefect tasks). The one driver of the stage: plan, refuse a resume with other settings or
    tasks, put the run's lineage row on record before the first shard commits, run the shards,
    rewrite the row with the model id and verifier versions the shards report.

    tasks: default `config_tasks(config)`; store: a Store or a path (default config.store).
    """
    from dataengine.stages.resources import open_store, verifier_versions

    started = time.perf_counter()
    execute = execute or in_process(policy=policy, env=env, progress=progress)
    plan = plan_generate(config, tasks=tasks, run_id=run_id)
    store = open_store(config.store if store is None else store)
    summary = GenerateSummary(run_id=plan.run_id, method=config.generate.method, store=str(store.root))
    todo = plan.todo(store)
    if todo:
        plan.check_resume(store)  # before any model loads: a refused resume fails in seconds
        if not store.committed_shards("tasks", plan.run_id):
            # A fresh run's settings key is on record before its first shard commits; the model id,
            # known where the shards run, comes with the row rewritten after them.
            record_generate_run(store, config, plan, model_id=None, verifier_versions=verifier_versions(config))
        new = {r.shard_id: r for r in execute(config, plan, store, todo) if not r.skipped}
    else:
        new = {}
    stored = committed_shard_counts(store, plan.run_id) if len(new) < len(plan.shards) else {}
    summary.shards = [new.get(s.shard_id) or stored.get(s.shard_id) or ShardResult(s.shard_id, skipped=True)
                      for s in plan.shards]
    for shard in summary.shards:
        summary.add(shard)
    if new:
        first = next(iter(new.values()))
        record_generate_run(store, config, plan, model_id=first.model_id, verifier_versions=first.verifier_versions)
    summary.seconds = time.perf_counter() - started
    return summary
