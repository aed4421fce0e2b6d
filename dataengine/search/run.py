"""One shard of a generation: search (or sample) its tasks and turn the trees into store rows.

`run_shard` searches config.search.trees_per_batch trees at a time (MCTS) or plays the
baselines; `write_shard` commits one Delta transaction per table, in the order nodes,
trajectories, tasks (the `tasks` rows mark the shard committed). Planning runs and shards, run
ids and the loop over shards are the generate stage's (dataengine.stages.generate).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mcts
from dataengine.budget import TokenBudget
from dataengine.config import EngineConfig
from dataengine.env import ToolEnv
from dataengine.policy.base import Policy
from dataengine.search.adapter import LLMExpander
from dataengine.search.baselines import PlayedEpisode, play_episodes
from dataengine.search.counters import ExpandCounters
from dataengine.search.nodes import NodeTable, PriorKind
from dataengine.search.rows import task_rows, trajectory_row, tree_rows
from dataengine.types import Task
from dataengine.verifiers.composite import CompositeReward

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
    task_tokens: dict[str, int] = field(default_factory=dict)
    env_seconds: float = 0.0
    verify_seconds: float = 0.0


# ---------------------------------------------------------------------------- one batch


def reward_bounds(
    reward: CompositeReward, process_reward_cap: float = 0.0, objective: str = "composite"
) -> tuple[float, float]:
    """(lowest, highest) return of a path: the syntax penalty cap to success plus all shaping
    (objectives "success" and "efficient_success": 0 to success), widened by the process reward
    cap (a whole path adds at most the cap)."""
    w = reward.weights
    if objective in ("success", "efficient_success"):
        return -process_reward_cap, w.success + process_reward_cap
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
        "min_leaves": s.min_leaves,
    }
    if q_normalisation == "reward_bounds":
        low, high = reward_bounds(reward, s.process_reward_cap, s.objective)
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
        out = mcts.gumbel_muzero_policy(root, expander, max_num_considered_actions=s.action_slots, **common)
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
            out.task_tokens.update({t.id: used for t, used in zip(part, batch.budget.used)})
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
    out.task_tokens = {t.id: used for t, used in zip(tasks, budget.used)}
    done.update(trees_done=len(tasks), tokens=budget.total, successes=sum(e.success for e in episodes))
    report({})
    return out


def write_shard(store: Any, out: ShardOutput, run_id: str) -> None:
    """One transaction per table: nodes, trajectories, then tasks (the commit marker); reads
    leave the shard's nodes and trajectories out until its tasks rows are committed. The tasks
    rows carry each task's generated tokens, so a resumed run can count a committed shard's."""
    if out.nodes:
        store.append("nodes", out.nodes, run_id=run_id, shard_id=out.shard_id, marker="tasks")
    store.append("trajectories", out.trajectories, run_id=run_id, shard_id=out.shard_id, marker="tasks")
    tasks = [{**row, "generated_tokens": out.task_tokens.get(row["task_id"])} for row in out.tasks]
    store.append("tasks", tasks, run_id=run_id, shard_id=out.shard_id)
