"""LLM tree search over tool-use episodes and the sampling baselines.

    from dataengine.search import search_batch, run_shard, LLMExpander
    out = run_shard(shard_id, tasks, method="mcts", policy=..., env=..., reward=..., config=..., seed=0)

A whole run (plan, run id, shards, store) is the generate stage: dataengine.stages.generate.

See docs/search.md. The tensor search itself lives in mcts/; this package is its LLM adapter
(nodes = conversation + env snapshot, edges = merged sampled actions) and the store writer.
"""

from dataengine.budget import TokenBudget
from dataengine.search.adapter import LLMExpander
from dataengine.search.baselines import PlayedEpisode, best_of_n, greedy, play_episodes
from dataengine.search.counters import ExpandCounters
from dataengine.search.leaves import LeafValue
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
    SearchBatch,
    ShardOutput,
    batch_rows,
    run_shard,
    search_batch,
    write_shard,
)

__all__ = [
    "METHODS",
    "Edge",
    "ExpandCounters",
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
    "edge_priors",
    "greedy",
    "merge_samples",
    "play_episodes",
    "prior_logits",
    "run_shard",
    "search_batch",
    "write_shard",
]
