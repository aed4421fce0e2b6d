"""LLM tree search over tool-use episodes, sampling baselines, and generation runs.

    from dataengine.search import generate, search_batch, run_shard, LLMExpander
    summary = generate(config, method="mcts")       # or "best_of_n", "greedy"

See docs/search.md. The tensor search itself lives in mcts/; this package is its LLM adapter
(nodes = conversation + env snapshot, edges = merged sampled actions) and the store writer.
"""

from dataengine.search.adapter import ExpandCounters, LeafValue, LLMExpander
from dataengine.search.baselines import PlayedEpisode, best_of_n, greedy, play_episodes
from dataengine.search.budget import TokenBudget
from dataengine.search.nodes import (
    Edge,
    NodeTable,
    SearchNode,
    edge_priors,
    merge_samples,
    prior_logits,
)
from dataengine.search.run import (
    METHODS,
    GenerateSummary,
    SearchBatch,
    ShardOutput,
    batch_rows,
    config_tasks,
    default_run_id,
    generate,
    make_policy_from_config,
    make_reward,
    run_shard,
    search_batch,
    shards,
    write_shard,
)

__all__ = [
    "METHODS",
    "Edge",
    "ExpandCounters",
    "GenerateSummary",
    "LLMExpander",
    "LeafValue",
    "NodeTable",
    "PlayedEpisode",
    "SearchBatch",
    "SearchNode",
    "ShardOutput",
    "TokenBudget",
    "batch_rows",
    "best_of_n",
    "config_tasks",
    "default_run_id",
    "edge_priors",
    "generate",
    "greedy",
    "make_policy_from_config",
    "make_reward",
    "merge_samples",
    "play_episodes",
    "prior_logits",
    "run_shard",
    "search_batch",
    "shards",
    "write_shard",
]
