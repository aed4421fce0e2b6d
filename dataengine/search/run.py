"""Run a generation: split tasks into shards, search (or sample) each, write the store.

    from dataengine.config import load_config
    from dataengine.search import generate
    summary = generate(load_config(search__num_simulations=16), method="mcts")

Per shard (config.shard_size tasks, searched config.search.trees_per_batch trees at a time):
one Delta transaction per table, in the order nodes, trajectories, tasks; the `tasks` rows
mark the shard committed, so a rerun with the same run id skips it (Store.committed_shards).
The run's lineage (config, code version, model and checkpoint hash, verifier versions, seed)
goes to `runs` first.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Self

import mcts
from dataengine.config import EngineConfig
from dataengine.env import ToolEnv
from dataengine.policy.base import Policy
from dataengine.search.adapter import ExpandCounters, LLMExpander
from dataengine.search.baselines import PlayedEpisode, play_episodes
from dataengine.search.budget import TokenBudget
from dataengine.search.nodes import NodeTable, PriorKind
from dataengine.search.rows import task_rows, trajectory_row, tree_rows
from dataengine.types import Task, stable_hash
from dataengine.verifiers.composite import CompositeReward, RewardWeights

Method = Literal["mcts", "best_of_n", "greedy"]
QNormalisation = Literal["reward_bounds", "parent_and_siblings"]
METHODS = ("mcts", "best_of_n", "greedy")


@dataclass
class SearchBatch:
    """B searched trees: the node table, the tensor tree, counters and the token budget."""

    tasks: list[Task]
    table: NodeTable
    tree: mcts.Tree
    counters: ExpandCounters
    budget: TokenBudget


@dataclass
class ShardOutput:
    """What one shard produced, ready for the store (rows are lists of dicts)."""

    shard_id: str
    tasks: list[dict]
    nodes: list[dict]
    trajectories: list[dict]
    simulations: int = 0
    generated_tokens: int = 0
    env_seconds: float = 0.0
    verify_seconds: float = 0.0


@dataclass
class GenerateSummary:
    """A generation run, as flows and the CLI print it.

    trees: tasks searched (or sampled) in this call; simulations: MCTS simulations backed up
    (0 for baselines); successes: successful trajectories; solved: tasks with at least one;
    seconds: wall time of this call; model_seconds: time inside the policy (sampling, scoring);
    env_seconds / verify_seconds / store_seconds: time in env steps (sandboxed tool calls),
    terminal verifiers and store writes (search only; baselines count them in the rest).
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

    @property
    def successes_per_million_tokens(self) -> float:
        return 1e6 * self.successes / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def outside_model_share(self) -> float:
        """Share of wall time spent outside the policy (env, verifiers, search core, store)."""
        return 1.0 - self.model_seconds / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("solved_task_ids")
        out["successes_per_million_tokens"] = round(self.successes_per_million_tokens, 1)
        out["outside_model_share"] = round(self.outside_model_share, 4)
        return out


# ---------------------------------------------------------------------------- tasks, shards


def config_tasks(config: EngineConfig) -> list[Task]:
    """config.num_tasks tasks of each suite in config.suites, of config.split, seeded by config.seed."""
    from dataengine.suites import generate_suite

    tasks: list[Task] = []
    for suite in config.suites:
        if config.split == "train":
            tasks += generate_suite(suite, n_train=config.num_tasks, n_heldout=0, seed=config.seed)
        else:
            tasks += generate_suite(suite, n_train=0, n_heldout=config.num_tasks, seed=config.seed)
    return tasks


def shards(tasks: Sequence[Task], shard_size: int) -> list[tuple[str, list[Task]]]:
    """(shard_id, tasks) in order; shard_id names the task index range, e.g. "tasks-000000-000003"."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out = []
    for start in range(0, len(tasks), shard_size):
        part = list(tasks[start : start + shard_size])
        out.append((f"tasks-{start:06d}-{start + len(part) - 1:06d}", part))
    return out


def default_run_id(config: EngineConfig, method: str, tasks: Sequence[Task]) -> str:
    """A run id fixed by the config, method, tasks and prompt template: rerunning the same
    command resumes; changing the template (a new engine version) starts a new run."""
    from dataengine.chat_template import prompt_fingerprint

    key = stable_hash({
        "config": config.model_dump(mode="json"),
        "method": method,
        "tasks": [t.id for t in tasks],
        "prompt": prompt_fingerprint(config.policy.few_shot),
    })
    return f"generate-{method}-{key[:10]}"


def make_reward(config: EngineConfig, env: ToolEnv) -> CompositeReward:
    """The composite reward of config.reward (empty weights: the documented defaults)."""
    weights = RewardWeights(shaping=dict(config.reward.weights)) if config.reward.weights else None
    return CompositeReward(weights=weights, replay=env.replay)


# ---------------------------------------------------------------------------- one batch


def reward_bounds(reward: CompositeReward, process_reward_cap: float = 0.0) -> tuple[float, float]:
    """(lowest, highest) return of a path: the syntax penalty cap to success plus all shaping,
    widened by the process reward cap (a whole path adds at most the cap)."""
    w = reward.weights
    return w.syntax_penalty_cap - process_reward_cap, w.success + w.shaping_cap + process_reward_cap


def search_batch(
    tasks: Sequence[Task],
    *,
    policy: Policy,
    env: ToolEnv,
    reward: CompositeReward,
    config: EngineConfig,
    seed: int,
    prior: PriorKind = "logprob",
    rollouts: int = 2,
    value_model: Any = None,
    on_expand: Callable[[LLMExpander], None] | None = None,
    q_normalisation: QNormalisation = "reward_bounds",
) -> SearchBatch:
    """Search B = len(tasks) trees together with config.search (algorithm, budgets, values).

    q_normalisation (puct and uct): "reward_bounds" normalises Q by the fixed range the
    composite reward can take (`reward_bounds`); "parent_and_siblings" is mctx's min-max by
    the node's value and visited siblings, under which the first terminal whose reward beats
    the parent's value maps to 1 and unvisited siblings to 0, so PUCT keeps revisiting it.
    gumbel always uses its completed-Q transform.
    """
    s = config.search
    expander = LLMExpander(
        policy,
        env,
        reward,
        s,
        config.policy,
        prior=prior,
        rollouts=rollouts,
        value_model=value_model,
        seed=seed,
        on_expand=on_expand,
    )
    root = expander.roots(tasks)
    common: dict[str, Any] = {
        "num_simulations": s.num_simulations,
        "seed": seed,
        "max_depth": s.max_depth,
        "leaves_per_iteration": s.leaves_per_iteration,
    }
    if q_normalisation == "reward_bounds":
        low, high = reward_bounds(reward, s.process_reward_cap)
        common["qtransform"] = functools.partial(mcts.qtransform_by_min_max, min_value=low, max_value=high)
    elif q_normalisation != "parent_and_siblings":
        raise ValueError(f"q_normalisation must be 'reward_bounds' or 'parent_and_siblings', got {q_normalisation!r}")
    if s.algorithm == "puct":
        out = mcts.muzero_policy(
            root,
            expander,
            dirichlet_fraction=s.dirichlet_fraction,
            dirichlet_alpha=s.dirichlet_alpha,
            pb_c_init=s.pb_c_init,
            pb_c_base=s.pb_c_base,
            **common,
        )
    elif s.algorithm == "uct":
        out = mcts.uct_policy(root, expander, **common)
    else:
        common.pop("qtransform", None)
        out = mcts.gumbel_muzero_policy(root, expander, max_num_considered_actions=s.num_actions, **common)
    return SearchBatch(list(tasks), expander.table, out.search_tree, expander.counters, expander.budget)


def batch_rows(batch: SearchBatch, model_id: str) -> tuple[list[dict], list[dict]]:
    """(`nodes` rows, `trajectories` rows) of every tree of the batch."""
    nodes, trajs = [], []
    for b in range(len(batch.tasks)):
        n, t = tree_rows(batch.table, batch.tree, b, model_id=model_id)
        nodes += n
        trajs += t
    return nodes, trajs


def episode_rows(episodes: Sequence[PlayedEpisode], source: str, model_id: str) -> list[dict]:
    return [
        trajectory_row(
            e.state,
            traj_id=f"{e.state.task.id}/{source}-{e.number}",
            source=source,
            reward=e.reward,
            success=e.success,
            verdicts=e.verdicts,
            generated_tokens=e.tokens,
            model_id=model_id,
        )
        for e in episodes
    ]


# ---------------------------------------------------------------------------- one shard


def run_shard(
    shard_id: str,
    tasks: Sequence[Task],
    *,
    method: Method,
    policy: Policy,
    env: ToolEnv,
    reward: CompositeReward,
    config: EngineConfig,
    seed: int,
    n: int | None = None,
    prior: PriorKind = "logprob",
    rollouts: int = 2,
    value_model: Any = None,
    on_progress: Callable[[dict[str, int]], None] | None = None,
) -> ShardOutput:
    """Search (or sample) one shard of tasks; returns its rows (nothing is written).

    n: episodes per task for best_of_n (default: config.search.num_simulations).
    on_progress: called with running totals {trees_done, simulations, tokens, successes} of
        this shard.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    out = ShardOutput(shard_id=shard_id, tasks=task_rows(tasks), nodes=[], trajectories=[])
    s = config.search
    done = {"trees_done": 0, "simulations": 0, "tokens": 0, "successes": 0}

    def report(extra: dict[str, int]) -> None:
        if on_progress is not None:
            on_progress({k: done[k] + extra.get(k, 0) for k in done})

    if method == "mcts":
        for start in range(0, len(tasks), s.trees_per_batch):
            part = list(tasks[start : start + s.trees_per_batch])

            def live(expander: LLMExpander, roots: int = len(part)) -> None:
                c = expander.counters
                # Each new leaf is one simulation; revisits of terminal leaves are added at the end.
                report({"simulations": c.nodes - roots, "tokens": c.generated_tokens, "successes": c.successes})

            batch = search_batch(
                part,
                policy=policy,
                env=env,
                reward=reward,
                config=config,
                seed=seed + start,
                prior=prior,
                rollouts=rollouts,
                value_model=value_model,
                on_expand=live,
            )
            nodes, trajs = batch_rows(batch, policy.model_id)
            out.nodes += nodes
            out.trajectories += trajs
            sims = int(batch.tree.num_simulations.sum())
            out.simulations += sims
            out.generated_tokens += batch.budget.total
            out.env_seconds += batch.counters.env_seconds
            out.verify_seconds += batch.counters.verify_seconds
            done["trees_done"] += len(part)
            done["simulations"] += sims
            done["tokens"] += batch.budget.total
            done["successes"] += sum(bool(t["success"]) for t in trajs)
            report({})
        return out

    budget = TokenBudget.for_tasks(len(tasks), s.max_generated_tokens)
    play = functools.partial(
        play_episodes,
        tasks,
        policy=policy,
        env=env,
        reward=reward,
        max_steps=s.max_depth,
        max_new_tokens=config.policy.max_new_tokens,
        top_p=config.policy.top_p,
        budget=budget,
        seed=seed,
        on_step=lambda eps: report({"tokens": budget.total, "successes": sum(e.success for e in eps)}),
    )
    if method == "greedy":
        episodes = play(n=1, wave=1, temperature=0.0)
    else:
        episodes = play(n=n or s.num_simulations, wave=s.num_actions, temperature=config.policy.temperature)
    out.trajectories = episode_rows(episodes, method, policy.model_id)
    out.generated_tokens = budget.total
    done.update(trees_done=len(tasks), tokens=budget.total, successes=sum(e.success for e in episodes))
    report({})
    return out


def write_shard(store: Any, out: ShardOutput, run_id: str) -> None:
    """One transaction per table: nodes, trajectories, then tasks (the commit marker)."""
    if out.nodes:
        store.append("nodes", out.nodes, run_id=run_id, shard_id=out.shard_id)
    store.append("trajectories", out.trajectories, run_id=run_id, shard_id=out.shard_id)
    store.append("tasks", out.tasks, run_id=run_id, shard_id=out.shard_id)


# ---------------------------------------------------------------------------- a whole run


def make_policy_from_config(config: EngineConfig) -> Policy:
    from dataengine.policy import make_policy

    p = config.policy
    options: dict[str, Any] = {"device": p.device}
    if p.backend == "hf":
        options["fewshot"] = p.few_shot
    return make_policy(p.backend, p.model, **options)


def generate(
    config: EngineConfig,
    *,
    method: Method = "mcts",
    tasks: Sequence[Task] | None = None,
    run_id: str | None = None,
    store: Any = None,
    policy: Policy | None = None,
    env: ToolEnv | None = None,
    n: int | None = None,
    prior: PriorKind = "logprob",
    rollouts: int = 2,
    value_model: Any = None,
    progress: bool = True,
) -> GenerateSummary:
    """Search (or sample) every task, shard by shard, and write each shard to the store.

    tasks: default `config_tasks(config)`. store: a storage.Store or a path (default
    config.store); None-able only through passing store=False (nothing is written).
    policy / env: built from config.policy / config.sandbox + config.env when not given (an
    env built here is closed at the end). Shards already committed for `run_id` are skipped.
    """
    from storage import Store

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    tasks = list(tasks) if tasks is not None else config_tasks(config)
    if not tasks:
        raise ValueError("no tasks to generate from (config.num_tasks or the task list is empty)")
    run_id = run_id or default_run_id(config, method, tasks)
    if store is None:
        store = config.store
    if store is not False and not isinstance(store, Store):
        store = Store(store)
    started = time.perf_counter()
    summary = GenerateSummary(run_id=run_id, method=method, store=str(store.root) if store else None)
    parts = shards(tasks, config.shard_size)
    store_started = time.perf_counter()
    committed = store.committed_shards("tasks", run_id) if store else set()
    summary.store_seconds += time.perf_counter() - store_started
    todo = [(i, sid, part) for i, (sid, part) in enumerate(parts) if sid not in committed]
    summary.shards_skipped = len(parts) - len(todo)
    if not todo:
        summary.seconds = time.perf_counter() - started
        return summary

    with ExitStack() as stack:
        if policy is None:
            policy = make_policy_from_config(config)
        if env is None:
            from dataengine.tools.sandbox import Sandbox

            sb = config.sandbox
            sandbox = stack.enter_context(
                Sandbox(
                    workers=sb.workers,
                    timeout_s=sb.timeout_s,
                    memory_mb=sb.memory_mb,
                    cpu_s=sb.cpu_s,
                    max_output_bytes=sb.max_output_bytes,
                    preload=sorted({t.toolbox for t in tasks}),
                )
            )
            env = ToolEnv(sandbox, max_steps=config.env.max_steps)
        reward = make_reward(config, env)
        model_before = policy.stats.seconds
        if store:
            store_started = time.perf_counter()
            store.record_run(
                run_id,
                kind="generate",
                config={"engine": config.model_dump(mode="json"), "method": method, "n": n, "prior": prior, "rollouts": rollouts},
                model_id=policy.model_id,
                checkpoint_hash=policy.model_id.rsplit("@", 1)[-1] if "@" in policy.model_id else None,
                verifier_versions=reward.versions(),
                seed=config.seed,
                source_versions=store.table_versions(),
            )
            summary.store_seconds += time.perf_counter() - store_started
        bar = _Progress(len(tasks) - sum(len(p) for sid, p in parts if sid in committed), method, enabled=progress)
        with bar:
            for index, shard_id, part in todo:
                out = run_shard(
                    shard_id,
                    part,
                    method=method,
                    policy=policy,
                    env=env,
                    reward=reward,
                    config=config,
                    seed=config.seed + 1_000 * index,
                    n=n,
                    prior=prior,
                    rollouts=rollouts,
                    value_model=value_model,
                    on_progress=bar.update,
                )
                if store:
                    written = time.perf_counter()
                    write_shard(store, out, run_id)
                    summary.store_seconds += time.perf_counter() - written
                bar.finish_shard()
                summary.trees += len(part)
                summary.simulations += out.simulations
                summary.nodes += len(out.nodes)
                summary.trajectories += len(out.trajectories)
                summary.successes += sum(bool(t["success"]) for t in out.trajectories)
                solved = sorted({t["task_id"] for t in out.trajectories if t["success"]})
                summary.solved += len(solved)
                summary.solved_task_ids += solved
                summary.generated_tokens += out.generated_tokens
                summary.env_seconds += out.env_seconds
                summary.verify_seconds += out.verify_seconds
                summary.shards_written += 1
        summary.model_seconds = policy.stats.seconds - model_before
    summary.seconds = time.perf_counter() - started
    return summary


class _Progress:
    """A rich progress bar over trees, with simulations, tokens and successes."""

    def __init__(self, trees: int, method: str, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.base = {"trees_done": 0, "simulations": 0, "tokens": 0, "successes": 0}
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn(f"[bold]{method}[/] trees"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("sims {task.fields[simulations]}  tokens {task.fields[tokens]}  successes {task.fields[successes]}"),
            TimeElapsedColumn(),
        )
        self.task = self.progress.add_task("trees", total=trees, simulations=0, tokens=0, successes=0)
        self.current = dict(self.base)

    def __enter__(self) -> Self:
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.__exit__(*exc)

    def update(self, shard: dict[str, int]) -> None:
        if not self.enabled:
            return
        self.current = {k: self.base[k] + shard.get(k, 0) for k in self.base}
        self.progress.update(
            self.task,
            completed=self.current["trees_done"],
            simulations=self.current["simulations"],
            tokens=self.current["tokens"],
            successes=self.current["successes"],
        )

    def finish_shard(self) -> None:
        if self.enabled:
            self.base = dict(self.current)
