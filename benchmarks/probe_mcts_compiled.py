"""Where do compiled=True trees leave the eager loop's? A probe of mcts.search's compiled loop.

Runs the same seeded PUCT search eagerly (the fixed-step loop, graphs=True on CPU) and compiled,
four ways: PUCT as shipped or with its exp and log replaced by exact arithmetic, and the
synthetic environment's expand inside the compiled graph (graph-safe) or eagerly between the
compiled selection and backup. Prints, for each, how many trees equal the eager ones. Then
compares SyntheticEnv.expand compiled alone against eager. Takes a few minutes (compiling).

    .venv/bin/python benchmarks/probe_mcts_compiled.py
"""

from __future__ import annotations

import torch

import mcts
import mcts.action_selection as rules
from mcts.synthetic import SyntheticEnv

SHIPPED = rules.puct_scores


def exact_scores(stats, *, pb_c_init=1.25, pb_c_base=19652.0, qtransform=rules.qtransform_by_parent_and_siblings):
    """PUCT-shaped scores from exactly rounded operations only (no exp, log or sum)."""
    visits = stats.visits.to(stats.qvalues.dtype).unsqueeze(-1)
    pb_c = pb_c_init + (visits + pb_c_base + 1.0) / pb_c_base
    probs = torch.where(torch.isneginf(stats.prior_logits), 0.0, (stats.prior_logits.clamp(-10, 10) + 10) / 20)
    return qtransform(stats) + torch.sqrt(visits) * pb_c * probs / (stats.children_visits + 1.0)


def main() -> None:
    torch.set_num_threads(1)
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)
    eager_expand = lambda p, a, v: env.expand(p, a, v)  # noqa: E731 -- not graph-safe: runs between graphs
    for scores_name, scores in [("PUCT as shipped", SHIPPED), ("PUCT without exp/log", exact_scores)]:
        rules.puct_scores = scores
        for expand_name, expand in [("expand compiled in the graph", env.expand), ("expand eager", eager_expand)]:
            for b in (1, 64):
                trees = [
                    mcts.muzero_policy(env.root(b), expand, num_simulations=64, dirichlet_fraction=0.0, graphs=True,
                                       compiled=c).search_tree
                    for c in (False, True)
                ]
                same = sum(all(torch.equal(t[i], trees[1].tensors()[k][i]) for k, t in trees[0].tensors().items())
                           for i in range(b))
                print(f"{scores_name:22s} {expand_name:30s} B={b:3d}: {same}/{b} trees equal to the eager loop's")
    rules.puct_scores = SHIPPED
    root = env.root(64)
    parents = root.handle.unsqueeze(-1).expand(64, 8).contiguous()
    actions = torch.arange(8).expand(64, 8).contiguous()
    valid = torch.ones_like(parents, dtype=torch.bool)
    eager, compiled = env.expand(parents, actions, valid), torch.compile(env.expand, dynamic=False)(parents, actions, valid)
    for field in ("handle", "reward", "value", "prior_logits"):
        print(f"SyntheticEnv.expand compiled alone, 64 x 8: {field} equal: {torch.equal(getattr(eager, field), getattr(compiled, field))}")


if __name__ == "__main__":
    main()
