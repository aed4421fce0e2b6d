"""ExpandCounters: the running totals of one search batch, shared by the expander's parts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExpandCounters:
    """Running totals of one search batch (the progress bar and the summary read them).

    calls: expand calls (iterations); nodes: nodes created (roots included); terminal: terminal
    nodes; successes: terminal nodes whose episode succeeded; generated_tokens: tokens sampled
    for expansions, widening and rollouts; env_seconds / verify_seconds / value_seconds: wall
    time in env steps, verifiers and value estimation (model time inside value estimation
    included); widen_rounds / widened_edges: widening rounds run and edges they added;
    scored_variants / variant_edges / variant_tokens: argument variants scored, added as edges,
    and the tokens of the added ones (charged to the trees' budgets like sampled tokens);
    transpositions: nodes equal to an earlier node of their tree; values_reused: value
    estimates taken from such a node instead of estimated; probes: contrast probes (terminal
    nodes outside the tensor tree, `SearchConfig.solved_contrast`).
    """

    calls: int = 0
    nodes: int = 0
    terminal: int = 0
    successes: int = 0
    generated_tokens: int = 0
    widen_rounds: int = 0
    widened_edges: int = 0
    scored_variants: int = 0
    variant_edges: int = 0
    variant_tokens: int = 0
    transpositions: int = 0
    values_reused: int = 0
    probes: int = 0
    env_seconds: float = 0.0
    verify_seconds: float = 0.0
    value_seconds: float = 0.0
