"""Whole searches: invariants, determinism, virtual loss, masking, resume, export, devices."""

from __future__ import annotations

import importlib
import math

import networkx as nx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mcts
from mcts.action_selection import NoiseTape
from mcts.base import ExpandOutput, RootInput
from mcts.policies import make_generator
from mcts.runners import Compiled
from mcts.search import init_tree
from mcts.synthetic import SyntheticEnv

POLICIES = [mcts.muzero_policy, mcts.uct_policy, mcts.gumbel_muzero_policy]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def one_thread():
    # Small tensors: extra intra-op threads only contend on a shared machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def check_invariants(tree: mcts.Tree, num_simulations: int) -> None:
    """Visit sums, value means and structure that every searched tree must satisfy."""
    for b in range(tree.batch_size):
        n = int(tree.num_nodes[b])
        visits = tree.node_visits[b, :n].double()
        child_visits = tree.children_visits[b, :n].double()
        q = (tree.children_rewards[b, :n] + tree.children_discounts[b, :n] * tree.children_values[b, :n]).double()
        assert int(tree.num_simulations[b]) == num_simulations
        assert child_visits[0].sum().item() == num_simulations
        # Unused slots stay free.
        assert (tree.node_visits[b, n:] == 0).all() and (tree.parents[b, n:] == mcts.NO_PARENT).all()
        for i in range(n):
            parent, action = int(tree.parents[b, i]), int(tree.action_from_parent[b, i])
            if i > 0:
                assert int(tree.children_index[b, parent, action]) == i
                assert child_visits[parent, action] == visits[i]
                assert int(tree.depth[b, i]) == int(tree.depth[b, parent]) + 1
            if child_visits[i].sum() > 0:
                assert visits[i] == 1 + child_visits[i].sum()
                # V(s) is the mean of the raw value and every return backed up through its edges.
                mean = (tree.raw_values[b, i].double() + (child_visits[i] * q[i]).sum()) / visits[i]
                assert tree.node_values[b, i].double().item() == pytest.approx(mean.item(), abs=1e-4)
            else:
                assert tree.node_values[b, i].item() == pytest.approx(tree.raw_values[b, i].item(), abs=1e-6)
            # Invalid actions are never expanded.
            invalid = torch.isneginf(tree.children_prior_logits[b, i])
            assert (tree.children_visits[b, i][invalid] == 0).all()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("leaves", [1, 4])
def test_invariants_hold_for_every_policy(policy, leaves):
    env = SyntheticEnv(num_actions=6, depth=4, discount=0.9)
    out = policy(env.root(5), env.expand, num_simulations=40, leaves_per_iteration=leaves, seed=3)
    check_invariants(out.search_tree, 40)
    assert out.action.shape == (5,) and out.action_weights.shape == (5, 6)
    torch.testing.assert_close(out.action_weights.sum(-1), torch.ones(5))
    root_invalid = torch.isneginf(out.search_tree.children_prior_logits[:, 0])
    assert not root_invalid.gather(1, out.action[:, None]).any()
    assert (out.action_weights[root_invalid] == 0).all()


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_tree_other_seed_other_tree(policy):
    env = SyntheticEnv(num_actions=6, depth=5)

    def run(seed):
        return policy(env.root(4), env.expand, num_simulations=30, leaves_per_iteration=2, seed=seed).search_tree

    a, b, c = run(7), run(7), run(8)
    for name, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[name]), name
    assert any(not torch.equal(t, c.tensors()[name]) for name, t in a.tensors().items())


@pytest.mark.parametrize("policy", POLICIES)
def test_search_finds_the_rewarded_first_action(policy):
    env = SyntheticEnv(num_actions=6, depth=3, seed=1)
    out = policy(env.root(8), env.expand, num_simulations=120, seed=0, **({"temperature": 0.0} if policy is not mcts.gumbel_muzero_policy else {}))
    best = env.correct_action(torch.zeros(8, dtype=torch.int64))
    assert (out.action == best).float().mean().item() >= 0.75


def test_virtual_loss_spreads_one_iteration_over_distinct_leaves():
    env = SyntheticEnv(num_actions=4, depth=3, invalid_fraction=0.0)
    calls = []

    def expand_fn(parent_handles, actions, valid):
        calls.append((actions.clone(), valid.clone()))
        return env.expand(parent_handles, actions, valid)

    out = mcts.muzero_policy(env.root(3), expand_fn, num_simulations=4, leaves_per_iteration=4, dirichlet_fraction=0.0)
    assert len(calls) == 1 and calls[0][1].all()
    # Each tree expanded its 4 root actions in the one call.
    assert (out.search_tree.children_visits[:, 0] == 1).all()
    assert sorted(calls[0][0][0].tolist()) == [0, 1, 2, 3]


def test_min_leaves_keeps_the_batch_wide_as_trees_finish():
    """min_leaves with L = 4 over 4 trees: while all 4 search, one leaf each, the trees of
    L = 1 bit for bit; min_leaves = 16 gives the trees of L = 4; once the trees given fewer
    simulations stop, the others take more leaves per call."""
    env = SyntheticEnv(num_actions=6, depth=4, invalid_fraction=0.0)
    calls = []

    def expand_fn(parent_handles, actions, valid):
        calls.append(valid.sum(1).tolist())
        return env.expand(parent_handles, actions, valid)

    def run(leaves, min_leaves=0, root=None, sims=24, fn=env.expand):
        root = env.root(4) if root is None else root
        return mcts.muzero_policy(root, fn, num_simulations=sims, leaves_per_iteration=leaves, min_leaves=min_leaves, seed=5).search_tree

    for (a, b) in ((run(1), run(4, min_leaves=4)), (run(4), run(4, min_leaves=16))):
        for name, t in a.tensors().items():
            assert torch.equal(t, b.tensors()[name]), name
    # Two trees whose root is terminal never search: the other two take 2 leaves per call.
    root = env.root(4)
    logits = root.prior_logits.clone()
    logits[:2] = float("-inf")
    calls.clear()
    tree = run(4, min_leaves=4, root=mcts.RootInput(prior_logits=logits, value=root.value, handle=root.handle), fn=expand_fn)
    assert calls[0] == [0, 0, 2, 2] and int(tree.num_simulations[2:].min()) == 24
    with pytest.raises(ValueError, match="min_leaves"):
        run(4, min_leaves=-1)


def test_collisions_are_dropped_and_budget_is_exact():
    # Two actions, eight leaves per iteration: most paths collide and are dropped.
    env = SyntheticEnv(num_actions=2, depth=6, invalid_fraction=0.0)
    out = mcts.uct_policy(env.root(2), env.expand, num_simulations=25, leaves_per_iteration=8)
    check_invariants(out.search_tree, 25)


def test_expand_receives_batched_handles_of_all_trees():
    env = SyntheticEnv(num_actions=4, depth=3)
    shapes = []

    def expand_fn(parent_handles, actions, valid):
        shapes.append((tuple(parent_handles.shape), parent_handles.dtype, actions.dtype, valid.dtype))
        return env.expand(parent_handles, actions, valid)

    mcts.gumbel_muzero_policy(env.root(5), expand_fn, num_simulations=6, leaves_per_iteration=3)
    assert shapes and all(s == ((5, 3), torch.int64, torch.int64, torch.bool) for s in shapes)


@pytest.mark.parametrize("leaves", [1, 4])
def test_gumbel_sequential_halving_visit_pattern(leaves):
    # 4 valid actions, 16 simulations: 4 actions x 2 visits, then 2 actions x 4 more.
    env = SyntheticEnv(num_actions=4, depth=8, invalid_fraction=0.0)
    out = mcts.gumbel_muzero_policy(
        env.root(3), env.expand, num_simulations=16, max_num_considered_actions=4, leaves_per_iteration=leaves
    )
    counts = out.search_tree.children_visits[:, 0].sort(-1).values
    assert counts.tolist() == [[2, 2, 6, 6]] * 3
    # The proposed action is one of the two most visited.
    chosen = out.search_tree.children_visits[:, 0].gather(1, out.action[:, None])
    assert (chosen == 6).all()


def test_invalid_root_actions_are_never_visited():
    env = SyntheticEnv(num_actions=5, depth=3, invalid_fraction=0.0)
    root = env.root(2)
    invalid = torch.tensor([[False, True, False, True, False], [True, True, True, True, False]])
    root = RootInput(root.prior_logits, root.value, root.handle, invalid_actions=invalid)
    for policy in POLICIES:
        out = policy(root, env.expand, num_simulations=20)
        assert (out.search_tree.children_visits[:, 0][invalid] == 0).all()
        assert out.action[1].item() == 4


def test_dirichlet_noise_keeps_invalid_actions_invalid_and_sums_to_one():
    logits = torch.tensor([[0.0, float("-inf"), 1.0, 2.0]])
    noisy = mcts.add_dirichlet_noise(logits, torch.Generator().manual_seed(0))
    assert torch.isneginf(noisy[0, 1]) and torch.isfinite(noisy[0, [0, 2, 3]]).all()
    assert noisy.softmax(-1).sum().item() == pytest.approx(1.0)
    assert not torch.allclose(noisy.softmax(-1), logits.softmax(-1))


def test_max_depth_bounds_the_tree():
    env = SyntheticEnv(num_actions=3, depth=10, invalid_fraction=0.0)
    out = mcts.muzero_policy(env.root(2), env.expand, num_simulations=60, max_depth=2)
    tree = out.search_tree
    assert int(tree.depth.max()) == 2
    check_invariants(tree, 60)


def test_max_nodes_stops_a_full_tree():
    env = SyntheticEnv(num_actions=4, depth=10, invalid_fraction=0.0)
    out = mcts.muzero_policy(env.root(2), env.expand, num_simulations=50, max_nodes=10)
    assert out.search_tree.num_nodes.tolist() == [10, 10]
    assert (out.search_tree.num_simulations == 9).all()


def test_resume_after_save_and_load_continues_identically(tmp_path):
    env = SyntheticEnv(num_actions=5, depth=5)
    first = mcts.gumbel_muzero_policy(env.root(3), env.expand, num_simulations=12, leaves_per_iteration=2, seed=1)
    mcts.save_tree(first.search_tree, tmp_path / "tree.pt")
    loaded = mcts.load_tree(tmp_path / "tree.pt")
    for name, t in first.search_tree.tensors().items():
        assert torch.equal(t, loaded.tensors()[name]), name
    in_memory = mcts.gumbel_muzero_policy(first.search_tree, env.expand, num_simulations=10, leaves_per_iteration=2, seed=2)
    resumed = mcts.gumbel_muzero_policy(loaded, env.expand, num_simulations=10, leaves_per_iteration=2, seed=2)
    for name, t in in_memory.search_tree.tensors().items():
        assert torch.equal(t, resumed.search_tree.tensors()[name]), name
    check_invariants(resumed.search_tree, 22)
    assert resumed.search_tree.max_nodes >= 23


def test_step_wise_api_equals_resumed_runs():
    env = SyntheticEnv(num_actions=4, depth=4)
    root = env.root(2)
    select = mcts.puct_action_selection

    def run(chunks):
        tree = init_tree(root, num_simulations=sum(chunks))
        gen = make_generator(0, "cpu")
        for k in chunks:
            tree = mcts.search(
                tree, env.expand, root_action_selection_fn=select, interior_action_selection_fn=select,
                num_simulations=k, generator=gen,
            )
        return tree

    one, three = run([30]), run([10, 10, 10])
    check_invariants(three, 30)
    for name, t in one.tensors().items():
        assert torch.equal(t, three.tensors()[name]), name


def test_non_contiguous_tree_searches_like_a_contiguous_one():
    # The search reads fields through cached flat views (Tree.rows) and writes with put_: a
    # tree whose tensors are strided differently must not be read from a stale copy.
    env = SyntheticEnv(num_actions=5, depth=5)
    first = mcts.muzero_policy(env.root(3), env.expand, num_simulations=12, max_nodes=40, seed=1)

    def strided(t):
        return t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() > 1 else t

    other = mcts.Tree(**{name: strided(t.clone()) for name, t in first.search_tree.tensors().items()})
    assert not other.children_visits.is_contiguous()
    again = mcts.muzero_policy(first.search_tree, env.expand, num_simulations=10, max_nodes=40, seed=2)
    resumed = mcts.muzero_policy(other, env.expand, num_simulations=10, max_nodes=40, seed=2)
    assert resumed.search_tree.max_nodes == 40  # not grown: the strided tensors were searched in place
    for name, t in again.search_tree.tensors().items():
        assert torch.equal(t, resumed.search_tree.tensors()[name]), name


def test_load_tree_rejects_other_files(tmp_path):
    torch.save({"something": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a tree"):
        mcts.load_tree(tmp_path / "x.pt")


def test_tree_to_networkx_has_every_node_and_edge_attribute():
    env = SyntheticEnv(num_actions=4, depth=3)
    tree = mcts.muzero_policy(env.root(2), env.expand, num_simulations=15).search_tree
    g = mcts.tree_to_networkx(tree, 1)
    n = int(tree.num_nodes[1])
    assert g.number_of_nodes() == n and nx.is_arborescence(g)
    assert g.nodes[0]["visits"] == 16 and g.nodes[0]["handle"] == int(tree.node_handle[1, 0])
    for i in range(1, n):
        (parent,) = g.predecessors(i)
        edge = g.edges[parent, i]
        assert edge["action"] == int(tree.action_from_parent[1, i])
        assert edge["visits"] == g.nodes[i]["visits"]
        assert set(g.nodes[i]) >= {"handle", "visits", "value", "reward", "prior", "depth", "terminal"}
        assert g.nodes[i]["depth"] == g.nodes[parent]["depth"] + 1
    with pytest.raises(IndexError, match="out of range"):
        mcts.tree_to_networkx(tree, 2)


def test_bad_expand_output_is_named():
    env = SyntheticEnv(num_actions=4, depth=3)

    def wrong(parent_handles, actions, valid):
        out = env.expand(parent_handles, actions, valid)
        return ExpandOutput(out.reward[:, :1], out.discount, out.prior_logits, out.value, out.handle, out.terminal)

    with pytest.raises(ValueError, match="ExpandOutput.reward"):
        mcts.muzero_policy(env.root(2), wrong, num_simulations=4, leaves_per_iteration=2)
    with pytest.raises(ValueError, match="RootInput.value"):
        init_tree(RootInput(torch.zeros(2, 3), torch.zeros(3), torch.zeros(2, dtype=torch.int64)), num_simulations=2)


def test_root_without_valid_actions_is_not_searched():
    root = RootInput(torch.full((1, 3), float("-inf")), torch.zeros(1), torch.zeros(1, dtype=torch.int64))
    for policy in POLICIES:
        out = policy(root, SyntheticEnv(num_actions=3).expand, num_simulations=5)
        assert out.search_tree.num_simulations.tolist() == [0]
        assert out.action.tolist() == [-1] and (out.action_weights == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_every_device(device):
    env = SyntheticEnv(num_actions=6, depth=4)
    for policy in POLICIES:
        out = policy(env.root(4, device=device), env.expand, num_simulations=20, leaves_per_iteration=2, device=device)
        assert out.search_tree.device.type == device and out.action.device.type == device
        check_invariants(out.search_tree.to("cpu"), 20)


@settings(max_examples=20, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    k=st.integers(2, 6),
    b=st.integers(1, 4),
    leaves=st.integers(1, 5),
    sims=st.integers(0, 30),
    depth=st.integers(1, 5),
    max_depth=st.one_of(st.none(), st.integers(1, 4)),
    invalid=st.sampled_from([0.0, 0.5]),
    seed=st.integers(0, 3),
)
def test_invariants_hold_for_random_configurations(policy, k, b, leaves, sims, depth, max_depth, invalid, seed):
    torch.set_num_threads(1)
    env = SyntheticEnv(num_actions=k, depth=depth, invalid_fraction=invalid, discount=0.8, seed=seed)
    out = policy(env.root(b), env.expand, num_simulations=sims, leaves_per_iteration=leaves, max_depth=max_depth, seed=seed)
    check_invariants(out.search_tree, sims)
    if max_depth is not None:
        assert int(out.search_tree.depth.max()) <= max_depth


def test_zero_simulations_propose_a_valid_action():
    env = SyntheticEnv(num_actions=6, depth=3, invalid_fraction=0.5)
    root = env.root(16)
    for policy in POLICIES:
        out = policy(root, env.expand, num_simulations=0)
        assert not torch.isneginf(root.prior_logits.gather(1, out.action[:, None])).any()


# ---------------------------------------------------------------- progressive widening, stop


class WideningEnv:
    """Nodes start with actions 0 and 1 of K = 4 valid; each widening of a node opens its next
    slot. Handles: child = parent * 8 + action + 1 (root b is b + 1). Episodes end at depth 2;
    the reward is 1 for ending with action 3, which only widening opens."""

    k = 4

    def __init__(self):
        self.opened: dict[int, int] = {}
        self.expanded: dict[int, set[int]] = {}
        self.offered: list[tuple[int, int]] = []

    def logits(self, handle: int) -> list[float]:
        n = 2 + self.opened.get(handle, 0)
        return [0.0] * n + [float("-inf")] * (self.k - n)

    def root(self, b: int) -> RootInput:
        return RootInput(
            torch.tensor([self.logits(h) for h in range(1, b + 1)]), torch.zeros(b), torch.arange(1, b + 1)
        )

    @staticmethod
    def depth(handle: int) -> int:
        d = 0
        while handle > 8:
            handle = (handle - 1) // 8
            d += 1
        return d

    def __call__(self, parent_handles, actions, valid):
        for b, l in valid.nonzero().tolist():
            self.expanded.setdefault(int(parent_handles[b, l]), set()).add(int(actions[b, l]))
        handle = parent_handles * 8 + actions + 1
        b, l = handle.shape
        depth = torch.tensor([[self.depth(int(h)) for h in row] for row in handle])
        terminal = depth >= 2
        logits = torch.tensor([[self.logits(int(h)) for h in row] for row in handle])
        return ExpandOutput(
            reward=(terminal & (actions == 3)).float(), discount=torch.ones(b, l), prior_logits=logits,
            value=torch.zeros(b, l), handle=handle, terminal=terminal,
        )

    def widen(self, handles, visits, valid):
        logits = torch.full((*handles.shape, self.k), float("-inf"))
        for b, w in valid.nonzero().tolist():
            h = int(handles[b, w])
            self.offered.append((h, int(visits[b, w])))
            # Offered only when exhausted: every valid action expanded, a slot free, not terminal.
            n = 2 + self.opened.get(h, 0)
            assert self.expanded.get(h) == set(range(n)) and n < self.k and self.depth(h) < 2
            self.opened[h] = self.opened.get(h, 0) + 1
            logits[b, w] = torch.tensor(self.logits(h))
        return mcts.WidenOutput(prior_logits=logits, widened=valid.clone())


@pytest.mark.parametrize("policy", POLICIES)
def test_widening_opens_actions_only_at_exhausted_nodes(policy):
    env = WideningEnv()
    tree = policy(env.root(3), env, num_simulations=40, leaves_per_iteration=2, seed=0).search_tree
    check_invariants(tree, 40)
    assert env.offered and all(visits >= 3 for _, visits in env.offered)
    # Every root was widened to all 4 actions and the rewarded action 3 was reached.
    root_valid = ~torch.isneginf(tree.children_prior_logits[:, 0])
    assert root_valid.all() and (tree.children_visits[:, 0, 2:] > 0).all()
    assert (tree.children_rewards == 1).any()
    # Without widening the same search never opens a slot.
    fresh = WideningEnv()
    plain = policy(fresh.root(3), lambda p, a, v: fresh(p, a, v), num_simulations=40, seed=0).search_tree
    assert torch.isneginf(plain.children_prior_logits[:, :, 2:]).all()


def test_widen_fn_argument_overrides_and_bad_widening_is_named():
    env = WideningEnv()
    calls = []

    def never(handles, visits, valid):
        calls.append(int(valid.sum()))
        return mcts.WidenOutput(torch.zeros(*handles.shape, 4), torch.zeros_like(valid))

    tree = mcts.muzero_policy(env.root(2), env, num_simulations=12, widen_fn=never).search_tree
    assert calls and torch.isneginf(tree.children_prior_logits[:, :, 2:]).all()

    def remove(handles, visits, valid):
        return mcts.WidenOutput(torch.full((*handles.shape, 4), float("-inf")), valid.clone())

    with pytest.raises(ValueError, match="already has a child"):
        mcts.muzero_policy(env.root(2), env, num_simulations=12, widen_fn=remove)


def test_expand_output_stop_ends_that_tree_only():
    env = SyntheticEnv(num_actions=4, depth=6)

    def expand_fn(parent_handles, actions, valid):
        out = env.expand(parent_handles, actions, valid)
        stop = torch.tensor([True] + [False] * (parent_handles.shape[0] - 1))
        return ExpandOutput(out.reward, out.discount, out.prior_logits, out.value, out.handle, out.terminal, stop=stop)

    for policy in POLICIES:
        tree = policy(env.root(3), expand_fn, num_simulations=10, leaves_per_iteration=2).search_tree
        assert tree.num_simulations.tolist() == [2, 10, 10]
    with pytest.raises(ValueError, match="ExpandOutput.stop"):
        def bad(p, a, v):
            out = env.expand(p, a, v)
            return ExpandOutput(out.reward, out.discount, out.prior_logits, out.value, out.handle, out.terminal, stop=torch.ones(1))

        mcts.muzero_policy(env.root(3), bad, num_simulations=4)


def stopping_expand(env: SyntheticEnv):
    """env.expand that stops tree 0 at its first expansion."""

    def expand_fn(parent_handles, actions, valid):
        out = env.expand(parent_handles, actions, valid)
        stop = torch.zeros(parent_handles.shape[0], dtype=torch.bool, device=parent_handles.device)
        stop[0] = True
        return ExpandOutput(out.reward, out.discount, out.prior_logits, out.value, out.handle, out.terminal, stop=stop)

    return expand_fn


@pytest.mark.parametrize("policy", [mcts.muzero_policy, mcts.gumbel_muzero_policy])
@pytest.mark.parametrize("case", ["plain", "max_depth", "max_nodes", "seed", "stop", "not_graph_safe"])
def test_fixed_step_loop_gives_the_eager_trees(policy, case):
    """graphs=True on CPU runs the loop CUDA graphs replay (fixed steps, fixed tensors) without
    capture: whole iterations for the graph-safe SyntheticEnv.expand, selection and backup
    around an eager expand otherwise ("stop", "not_graph_safe"). PUCT over distinct priors and
    Gumbel have no exact ties, so its trees equal the eager loop's bit for bit."""
    env = SyntheticEnv(num_actions=6, depth=5, discount=0.97, invalid_fraction=0.3)
    expand = {"stop": stopping_expand(env), "not_graph_safe": lambda p, a, v: env.expand(p, a, v)}.get(case, env.expand)
    kwargs = {"max_depth": {"max_depth": 3}, "max_nodes": {"max_nodes": 20}, "seed": {"seed": 3}}.get(case, {})
    eager, fixed = (policy(env.root(6), expand, num_simulations=40, graphs=g, **kwargs).search_tree for g in (False, True))
    for name, t in eager.tensors().items():
        assert torch.equal(t, fixed.tensors()[name]), name
    if case == "stop":
        assert fixed.num_simulations[0] == 1 and (fixed.num_simulations[1:] == 40).all()


@pytest.mark.parametrize("policy", [mcts.muzero_policy, mcts.gumbel_muzero_policy])
@pytest.mark.parametrize("case", ["graph_safe", "not_graph_safe", "max_depth", "widening"])
def test_long_walks_run_in_pieces_and_give_the_eager_trees(policy, case, monkeypatch):
    """Past LONG_WALK steps the fixed-step loop selects and backs up in pieces of PIECE steps
    (here 4 and 4, so deep walks take several pieces; a graph-safe expand function runs in the
    graph that starts the backup): the trees still equal the eager loop's, and compiled=True
    (identity compiler) gives that loop's trees and generator bit for bit. With widening the
    pieces also return the walk's path: the widen function is offered the same nodes."""
    search_module = importlib.import_module("mcts.search")  # mcts.search is also the function

    env = SyntheticEnv(num_actions=4, depth=14, discount=0.97, invalid_fraction=0.3)
    expand = (lambda p, a, v: env.expand(p, a, v)) if case == "not_graph_safe" else env.expand  # noqa: E731
    kwargs = {"num_simulations": 48, "seed": 2, **({"max_depth": 9} if case == "max_depth" else {})}
    offers: list[list[tuple[int, ...]]] = []
    if case == "widening":
        def widen_fn(handles, visits, valid):  # offered nodes are recorded; none is widened
            offers[-1].append(tuple(handles[valid].tolist()) + tuple(visits[valid].tolist()))
            b, w = handles.shape
            return mcts.WidenOutput(prior_logits=torch.zeros(b, w, 4), widened=torch.zeros(b, w, dtype=torch.bool))
        kwargs["widen_fn"] = widen_fn
    offers.append([])
    eager = policy(env.root(5), expand, graphs=False, **kwargs).search_tree
    assert int(eager.depth.max()) >= 8  # walks of 9 steps and more: three pieces
    calls = []
    monkeypatch.setattr(search_module, "LONG_WALK", 4)
    monkeypatch.setattr(search_module, "PIECE", 4)
    monkeypatch.setattr(Compiled, "compiler", staticmethod(lambda fn, options: fn))
    run = Compiled.__call__
    monkeypatch.setattr(Compiled, "__call__", lambda self, name, fn, steps: calls.append(name) or run(self, name, fn, steps))
    offers.append([])
    fixed = policy(env.root(5), expand, graphs=True, **kwargs)
    offers.append([])
    taped = policy(env.root(5), expand, compiled=True, **kwargs)
    assert calls.count("walk_more") > 0 and calls.count("climb_more") > 0
    if case == "widening":
        assert len(offers[0]) > 3 and offers[0] == offers[1] == offers[2]
    # A graph-safe expand function runs inside the graph that starts the backup, with the walk's
    # first piece when every walk ended in it.
    if case in ("not_graph_safe", "widening"):
        assert "walk_expand_climb" not in calls and "expand_climb" not in calls
    else:
        assert 0 < calls.count("expand_climb") < calls.count("walk_expand_climb")
    for name, t in eager.tensors().items():
        assert torch.equal(t, fixed.search_tree.tensors()[name]), name
        assert torch.equal(t, taped.search_tree.tensors()[name]), name
    assert torch.equal(fixed.action, taped.action)


def test_fixed_step_loop_keeps_invariants_where_ties_break_differently():
    # UCT ties every unvisited child: the noise that breaks them is drawn for a fixed number
    # of steps, so the trees differ from the eager loop's, but stay valid and seeded.
    env = SyntheticEnv(num_actions=6, depth=5, discount=0.97, invalid_fraction=0.3)
    a, b = (mcts.uct_policy(env.root(6), env.expand, num_simulations=40, graphs=True, seed=1).search_tree for _ in range(2))
    check_invariants(a, 40)
    for name, t in a.tensors().items():
        assert torch.equal(t, b.tensors()[name]), name
    # WideningEnv's priors tie too; widening runs between the fixed steps as in the eager loop.
    widening = WideningEnv()
    tree = mcts.muzero_policy(widening.root(3), widening, num_simulations=40, graphs=True).search_tree
    check_invariants(tree, 40)
    assert widening.offered and (~torch.isneginf(tree.children_prior_logits[:, 0])).all()
    with pytest.raises(ValueError, match="leaves_per_iteration=1"):
        mcts.muzero_policy(env.root(2), env.expand, num_simulations=4, leaves_per_iteration=2, graphs=True)


@pytest.mark.parametrize("field", ["value", "prior_logits"])
def test_whole_iteration_loop_names_nan_output(field):
    env = SyntheticEnv(num_actions=4, depth=4)

    def expand(p, a, v):
        out = env.expand(p, a, v)
        bad = {"value": out.value, "prior_logits": out.prior_logits}[field].clone()
        bad[1] = float("nan")  # tree 1 only
        return ExpandOutput(**{**out.__dict__, field: bad})

    expand.graph_safe = True
    with pytest.raises(ValueError, match=f"ExpandOutput.{field} holds NaN"):
        mcts.muzero_policy(env.root(3), expand, num_simulations=8, graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", [mcts.muzero_policy, mcts.gumbel_muzero_policy])
def test_cuda_graphs_give_the_eager_cuda_trees(policy):
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)
    split = lambda p, a, v: env.expand(p, a, v)  # noqa: E731 -- not graph-safe: expand runs between graphs
    for expand, kwargs in ((env.expand, {}), (env.expand, {"max_depth": 4}), (split, {})):
        graphed, eager = (
            policy(env.root(64, device="cuda"), expand, num_simulations=48, graphs=g, device="cuda", **kwargs).search_tree
            for g in (None, False)
        )
        check_invariants(graphed.to("cpu"), 48)
        for name, t in eager.tensors().items():
            torch.testing.assert_close(graphed.tensors()[name], t, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("policy", [mcts.muzero_policy, mcts.gumbel_muzero_policy])
@pytest.mark.parametrize("case", ["plain", "max_depth", "seed", "stop", "not_graph_safe"])
def test_noise_tape_gives_the_eager_trees(policy, case, monkeypatch):
    """compiled=True draws the rules' tie-break noise ahead of each compiled call (NoiseTape).
    With the compiler swapped for the identity, that path must equal the fixed-step loop it
    compiles (graphs=True on CPU with the expand function between graphs, itself equal to the
    eager loop's trees) bit for bit, and leave the generator where that loop does (the policy's
    action is drawn from it after the search)."""
    monkeypatch.setattr(Compiled, "compiler", staticmethod(lambda fn, options: fn))
    env = SyntheticEnv(num_actions=6, depth=5, discount=0.97, invalid_fraction=0.3)
    expand = {"stop": stopping_expand(env), "not_graph_safe": lambda p, a, v: env.expand(p, a, v)}.get(case, env.expand)
    kwargs = {"max_depth": {"max_depth": 3}, "seed": {"seed": 3}}.get(case, {})
    # The reference takes the same form: whole iterations for a graph-safe expand function,
    # else the expand function between graphs (same noise draws).
    fixed = policy(env.root(6), expand, num_simulations=40, graphs=True, **kwargs)
    taped = policy(env.root(6), expand, num_simulations=40, compiled=True, **kwargs)
    for name, t in fixed.search_tree.tensors().items():
        assert torch.equal(t, taped.search_tree.tensors()[name]), name
    assert torch.equal(fixed.action, taped.action)


def test_noise_tape_keeps_what_it_learnt_per_batch_shape(monkeypatch):
    # The noise a compiled call takes is learnt once per kind of search: another batch size
    # is another kind (a shared record once made the second search fail).
    monkeypatch.setattr(Compiled, "compiler", staticmethod(lambda fn, options: fn))
    env = SyntheticEnv(num_actions=5, depth=4, discount=0.97)
    for b in (2, 5, 2):
        fixed = mcts.muzero_policy(env.root(b), env.expand, num_simulations=12, graphs=True, seed=b)
        taped = mcts.muzero_policy(env.root(b), env.expand, num_simulations=12, compiled=True, seed=b)
        assert torch.equal(fixed.search_tree.node_visits, taped.search_tree.node_visits)


def test_compiled_search_names_a_compiler_failure(monkeypatch):
    # Seen on CUDA: Triton failed to build the Gumbel search's fused kernel. The error names the
    # way out, and the seeded generator is left where it was.
    from torch._inductor.exc import InductorError

    def broken(fn, options):
        def run(*args):
            raise InductorError(RuntimeError("PassManager::run failed"), None)
        return run

    monkeypatch.setattr(Compiled, "compiler", staticmethod(broken))
    monkeypatch.setattr(Compiled, "entry", {})
    env = SyntheticEnv(num_actions=5, depth=4, discount=0.97)
    g = torch.Generator().manual_seed(3)
    with pytest.raises(RuntimeError, match=r"could not build this search's iterate step on cpu \(RuntimeError: PassManager::run failed\); run it with compiled=False"):
        mcts.search(init_tree(env.root(2), num_simulations=4), env.expand, root_action_selection_fn=mcts.puct_action_selection,
                    interior_action_selection_fn=mcts.puct_action_selection, num_simulations=4, generator=g, compiled=True)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(3).get_state())


def test_compile_options_reach_the_compiler(monkeypatch):
    # A search's compile_options are added to the device's options (gumbel_muzero_policy
    # passes max_fusion_size on CUDA); each set of options is its own compiled entry point.
    seen = []
    monkeypatch.setattr(Compiled, "compiler", staticmethod(lambda fn, options: seen.append(options) or fn))
    monkeypatch.setattr(Compiled, "entry", {})
    env = SyntheticEnv(num_actions=5, depth=4, discount=0.97)
    for extra in ({"max_fusion_size": 8}, None, {"max_fusion_size": 8}):
        mcts.search(init_tree(env.root(2), num_simulations=4), env.expand, root_action_selection_fn=mcts.puct_action_selection,
                    interior_action_selection_fn=mcts.puct_action_selection, num_simulations=4, compiled=True,
                    compile_options=extra)
    assert seen == [{**Compiled.options["cpu"], "max_fusion_size": 8}, Compiled.options["cpu"]]


def test_noise_tape_hands_out_the_draws_made_one_by_one():
    g = torch.Generator().manual_seed(5)
    shapes = [(2, 3), (1, 3), (4, 3)]
    one_by_one = [torch.rand(shape, generator=g) for shape in shapes]
    after = torch.rand(3, generator=g)
    g.manual_seed(5)
    tape = NoiseTape(torch.rand(sum(math.prod(s) for s in shapes), generator=g))
    for shape, x in zip(shapes, one_by_one):
        assert torch.equal(tape.rand(shape), x)
    assert tape.offset == 21 and torch.equal(torch.rand(3, generator=g), after)
    with pytest.raises(ValueError, match="more tie-break noise"):
        tape.rand((1, 3))


@pytest.mark.slow
def test_compiled_synthetic_env_and_whole_iterations_give_the_eager_results():
    """The real compiler on the graph-safe SyntheticEnv.expand, alone and inside whole compiled
    iterations. An earlier hash relied on int64 wraparound, which the generated C++ treats as
    undefined: compiled, it gave the correct-action bonus to other actions and so other trees."""
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)
    handles = env.root(16).handle.unsqueeze(1)
    compiled_expand = torch.compile(env.expand, dynamic=False)
    for a in range(env.depth):
        actions = torch.full_like(handles, a)
        eager, compiled = env.expand(handles, actions, None), compiled_expand(handles, actions, None)
        for name in ("reward", "prior_logits", "value", "handle", "terminal"):
            assert torch.equal(getattr(eager, name), getattr(compiled, name)), (a, name)
        handles = eager.handle
    # max_depth fixes the walk length: one compiled variant (compiling is most of the cost).
    env = SyntheticEnv(num_actions=6, depth=5, discount=0.97, invalid_fraction=0.3)
    kwargs = {"num_simulations": 32, "max_depth": 4, "seed": 1}
    fixed = mcts.muzero_policy(env.root(8), env.expand, graphs=True, **kwargs)
    whole = mcts.muzero_policy(env.root(8), env.expand, compiled=True, **kwargs)
    for name, t in fixed.search_tree.tensors().items():
        assert torch.equal(t, whole.search_tree.tensors()[name]), name


@pytest.mark.slow
def test_compiled_pieces_give_the_eager_trees(monkeypatch):
    """The real compiler on deep walks in pieces (pieces of 4 past 4 steps here, so the graphs
    stay small): walk_expand_climb, walk_more, expand_climb and climb_more give the eager
    loop's trees bit for bit."""
    search_module = importlib.import_module("mcts.search")  # mcts.search is also the function
    monkeypatch.setattr(search_module, "LONG_WALK", 4)
    monkeypatch.setattr(search_module, "PIECE", 4)
    calls = []
    run = Compiled.__call__
    monkeypatch.setattr(Compiled, "__call__", lambda self, name, fn, steps: calls.append(name) or run(self, name, fn, steps))
    env = SyntheticEnv(num_actions=4, depth=14, discount=0.97, invalid_fraction=0.3)
    kwargs = {"num_simulations": 48, "seed": 2}
    eager = mcts.muzero_policy(env.root(5), env.expand, graphs=False, **kwargs)
    taped = mcts.muzero_policy(env.root(5), env.expand, compiled=True, **kwargs)
    assert {"walk_expand_climb", "walk_more", "expand_climb", "climb_more"} <= set(calls)
    assert int(eager.search_tree.depth.max()) >= 9  # walks of three pieces and more
    for name, t in eager.search_tree.tensors().items():
        assert torch.equal(t, taped.search_tree.tensors()[name]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", [mcts.muzero_policy, mcts.gumbel_muzero_policy])
def test_compiled_cuda_search_gives_valid_seeded_trees(policy):
    """compiled=True on CUDA (Triton kernels): whole iterations of the graph-safe SyntheticEnv.expand,
    one variant (max_depth fixes the walk length). Valid trees of the full budget, the same tree
    on a second seeded search, and the root visits of the CUDA graphs' trees wherever no exact tie
    broke another way (the tape's CUDA noise is other numbers than the eager draws). Gumbel's
    iteration builds with smaller fused kernels (max_fusion_size=8)."""
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)
    kwargs = {"num_simulations": 32, "max_depth": 4, "seed": 1, "device": "cuda"}
    runs = [policy(env.root(16, device="cuda"), env.expand, compiled=True, **kwargs) for _ in range(2)]
    check_invariants(runs[0].search_tree.to("cpu"), 32)
    for name, t in runs[0].search_tree.tensors().items():
        assert torch.equal(t, runs[1].search_tree.tensors()[name]), name
    graphed = policy(env.root(16, device="cuda"), env.expand, **kwargs).search_tree
    same = (graphed.children_visits[:, 0] == runs[0].search_tree.children_visits[:, 0]).all(-1)
    assert int(same.sum()) >= 14, same


@pytest.mark.slow
def test_compiled_search_gives_valid_seeded_trees():
    """The real torch.compile path with the expand function eager between compiled selection
    and backup (the form an LLM policy gets; tens of seconds to compile): fused exp, log and
    sums round differently from ATen's in the last bit, so the trees may differ from the eager
    loop's where scores nearly tie; they must still be valid trees of the full budget, and seeded."""
    env = SyntheticEnv(num_actions=4, depth=3, discount=0.97, invalid_fraction=0.3)
    expand = lambda p, a, v: env.expand(p, a, v)  # noqa: E731 -- not graph-safe
    # The second search reuses what the first learnt (noise per call, compiled code): same tree.
    runs = [mcts.muzero_policy(env.root(3), expand, num_simulations=24, max_depth=3, compiled=True, seed=2) for _ in range(2)]
    check_invariants(runs[0].search_tree, 24)
    for name, t in runs[0].search_tree.tensors().items():
        assert torch.equal(t, runs[1].search_tree.tensors()[name]), name
    eager = mcts.muzero_policy(env.root(3), env.expand, num_simulations=24, max_depth=3, seed=2).search_tree
    assert torch.equal(eager.num_simulations, runs[0].search_tree.num_simulations)
    with pytest.raises(ValueError, match="leaves_per_iteration=1"):
        mcts.muzero_policy(env.root(2), env.expand, num_simulations=4, leaves_per_iteration=2, compiled=True)
