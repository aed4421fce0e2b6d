"""Hand-computed checks of each piece of mcts/: Q transforms, selection rules, halving, backup."""

from __future__ import annotations

import math

import pytest
import torch

import mcts
from mcts import seq_halving
from mcts.base import ExpandOutput, NodeStats, RootInput
from mcts.search import NEW, REVISIT, backup, expand, init_tree, select_path
from mcts.tree import UNVISITED, qvalues

NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def one_thread():
    # Small tensors: extra intra-op threads only contend on a shared machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def stats(*, visits, value, raw_value=0.0, probs, children_visits, qvalues, invalid=None) -> NodeStats:
    """NodeStats of one node (B = 1) from plain numbers."""
    logits = torch.tensor([[math.log(p) if p > 0 else NEG_INF for p in probs]])
    return NodeStats(
        depth=torch.tensor([1]),
        visits=torch.tensor([float(visits)]),
        value=torch.tensor([value]),
        raw_value=torch.tensor([raw_value]),
        prior_logits=logits,
        children_visits=torch.tensor([children_visits], dtype=torch.float32),
        qvalues=torch.tensor([qvalues]),
        invalid=torch.isneginf(logits) if invalid is None else torch.tensor([invalid]),
    )


def test_parent_and_siblings_normalises_by_min_max_of_value_and_visited_q():
    s = stats(visits=3, value=0.4, probs=[0.5, 0.3, 0.2], children_visits=[1, 1, 0], qvalues=[0.5, 1.0, 9.0])
    # min = min(0.4, 0.5, 1.0) = 0.4, max = 1.0; the unvisited action is completed with the min.
    expected = torch.tensor([[(0.5 - 0.4) / 0.6, 1.0, 0.0]])
    torch.testing.assert_close(mcts.qtransform_by_parent_and_siblings(s), expected)


def test_min_max_with_fixed_bounds():
    s = stats(visits=3, value=0.0, probs=[0.5, 0.5], children_visits=[2, 0], qvalues=[0.5, 7.0])
    got = mcts.qtransform_by_min_max(s, min_value=-1.0, max_value=1.0)
    torch.testing.assert_close(got, torch.tensor([[0.75, 0.0]]))


def test_completed_by_mix_value_hand_computed():
    s = stats(
        visits=4, value=0.0, raw_value=0.5, probs=[0.5, 0.25, 0.25], children_visits=[2, 0, 1], qvalues=[1.0, 3.0, 0.0]
    )
    # weighted Q over visited = (0.5 * 1 + 0.25 * 0) / 0.75 = 2/3; mixed = (0.5 + 3 * 2/3) / 4 = 0.625.
    torch.testing.assert_close(mcts.qtransforms.mixed_value(s), torch.tensor([0.625]))
    # completed [1, 0.625, 0] is already in [0, 1]; scale = (50 + max visits 2) * 0.1 = 5.2.
    expected = torch.tensor([[5.2, 5.2 * 0.625, 0.0]])
    torch.testing.assert_close(mcts.qtransform_completed_by_mix_value(s), expected)


def test_puct_hand_computed():
    s = stats(visits=3, value=0.4, probs=[0.5, 0.3, 0.2], children_visits=[1, 1, 0], qvalues=[0.5, 1.0, 0.0])
    pb_c = 1.25 + math.log((3 + 19652 + 1) / 19652)
    scores = [
        (0.5 - 0.4) / 0.6 + math.sqrt(3) * pb_c * 0.5 / 2,
        1.0 + math.sqrt(3) * pb_c * 0.3 / 2,
        0.0 + math.sqrt(3) * pb_c * 0.2 / 1,
    ]
    assert max(range(3), key=scores.__getitem__) == 1
    assert mcts.puct_action_selection(s, torch.Generator().manual_seed(0)).tolist() == [1]
    # With action 1's Q at the minimum the unvisited action's prior term wins.
    s2 = stats(visits=3, value=0.4, probs=[0.5, 0.3, 0.2], children_visits=[1, 1, 0], qvalues=[0.5, 0.4, 0.0])
    assert mcts.puct_action_selection(s2, torch.Generator().manual_seed(0)).tolist() == [0]
    # 0.5's normalised Q is 1 now: 1 + 0.541 = 1.541 > 0 + 0.433 and 0 + 0.325.


def test_uct_hand_computed():
    # Q normalised: min = 0 (node value), max = 1 -> [1.0, 0.2, 0]; explore = sqrt(log 4 / (1 + n)).
    s = stats(visits=4, value=0.0, probs=[0.4, 0.3, 0.3], children_visits=[2, 1, 0], qvalues=[1.0, 0.2, 0.0])
    explore = [math.sqrt(math.log(4) / (1 + n)) for n in (2, 1, 0)]
    scores = [1.0 + explore[0], 0.2 + explore[1], 0.0 + explore[2]]
    assert max(range(3), key=scores.__getitem__) == 0
    assert mcts.uct_action_selection(s, torch.Generator().manual_seed(0)).tolist() == [0]
    # A larger c_exp makes exploration win: 3 * 1.177 > 1 + 3 * 0.680.
    assert mcts.uct_action_selection(s, torch.Generator().manual_seed(0), c_exp=3.0).tolist() == [2]


def test_selection_never_picks_invalid_actions():
    s = stats(visits=5, value=0.0, probs=[0.0, 1.0, 0.0], children_visits=[0, 4, 0], qvalues=[0.0, -5.0, 0.0])
    for rule in (mcts.puct_action_selection, mcts.uct_action_selection, mcts.gumbel_muzero_interior_action_selection):
        assert rule(s, torch.Generator().manual_seed(0)).tolist() == [1]


def test_gumbel_interior_follows_improved_policy_minus_visit_share():
    s = stats(visits=3, value=0.0, probs=[0.5, 0.5], children_visits=[2, 0], qvalues=[0.0, 0.0])
    # Equal completed Q -> improved policy [0.5, 0.5]; scores 0.5 - 2/3 and 0.5 - 0: action 1.
    assert mcts.gumbel_muzero_interior_action_selection(s).tolist() == [1]


def test_sequence_of_considered_visits_hand_computed():
    # m = 4, n = 16: phase 1 visits 4 actions twice, phase 2 visits 2 actions four times.
    assert seq_halving.get_sequence_of_considered_visits(4, 16) == (0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5)
    assert seq_halving.get_sequence_of_considered_visits(1, 5) == (0, 1, 2, 3, 4)
    table = seq_halving.get_table_of_considered_visits(4, 16)
    assert table.shape == (5, 16) and table[4, 9].item() == 2


def test_score_considered_penalises_other_visit_counts():
    scores = seq_halving.score_considered(
        torch.tensor([1.0]),
        torch.tensor([[0.0, 5.0, 0.0]]),
        torch.tensor([[0.0, 0.0, 1.0]]),
        torch.tensor([[0.0, 0.0, 0.0]]),
        torch.tensor([[1.0, 0.0, 1.0]]),
    )
    assert torch.isneginf(scores[0, 1]) and scores[0, 2] > scores[0, 0]


def scripted_expand(table: dict[tuple[int, int], tuple[float, float, list[float], float, bool]], k: int):
    """An expand function from a table (parent handle, action) -> (reward, discount, probs, value, terminal).

    The child's handle is parent * 10 + action + 1.
    """
    calls = []

    def expand_fn(parent_handles, actions, valid):
        calls.append((parent_handles.clone(), actions.clone(), valid.clone()))
        b, l = parent_handles.shape
        reward, discount, value = torch.zeros(b, l), torch.zeros(b, l), torch.zeros(b, l)
        logits, terminal = torch.full((b, l, k), NEG_INF), torch.zeros(b, l, dtype=torch.bool)
        handle = parent_handles * 10 + actions + 1
        for i in range(b):
            for j in range(l):
                if not valid[i, j]:
                    continue
                r, d, probs, v, t = table[(int(parent_handles[i, j]), int(actions[i, j]))]
                reward[i, j], discount[i, j], value[i, j], terminal[i, j] = r, d, v, t
                logits[i, j] = torch.tensor([math.log(p) if p > 0 else NEG_INF for p in probs])
        return ExpandOutput(reward, discount, logits, value, handle, terminal)

    expand_fn.calls = calls
    return expand_fn


def two_step_tree():
    """root(handle 1, V=0.5) -a0-> node 1 (r=1, d=0.5, V=1) -a1-> node 2 (r=0, d=0.5, V=4)."""
    root = RootInput(prior_logits=torch.log(torch.tensor([[0.5, 0.5]])), value=torch.tensor([0.5]), handle=torch.tensor([1]))
    table = {(1, 0): (1.0, 0.5, [0.5, 0.5], 1.0, False), (11, 1): (0.0, 0.5, [0.5, 0.5], 4.0, False)}
    tree = init_tree(root, num_simulations=4)
    fn = scripted_expand(table, 2)
    return tree, fn


def test_backup_hand_computed():
    tree, fn = two_step_tree()
    one = torch.ones(1, 1, dtype=torch.bool)
    n1 = expand(tree, fn, torch.tensor([[0]]), torch.tensor([[0]]), one)
    backup(tree, n1[:, 0], torch.tensor([True]))
    # root: (0.5 * 1 + (1 + 0.5 * 1)) / 2 = 1.0
    assert tree.node_values[0, 0].item() == pytest.approx(1.0)
    n2 = expand(tree, fn, n1, torch.tensor([[1]]), one)
    assert n2.tolist() == [[2]] and tree.node_handle[0, 2].item() == 112
    backup(tree, n2[:, 0], torch.tensor([True]))
    # node 1: G = 0 + 0.5 * 4 = 2 -> (1 * 1 + 2) / 2 = 1.5; root: G = 1 + 0.5 * 2 = 2 -> (1 * 2 + 2) / 3.
    assert tree.node_values[0, 1].item() == pytest.approx(1.5)
    assert tree.node_values[0, 0].item() == pytest.approx(4 / 3)
    assert tree.node_visits[0, :3].tolist() == [3, 2, 1]
    assert tree.children_visits[0, 0].tolist() == [2, 0] and tree.children_visits[0, 1].tolist() == [0, 1]
    assert tree.children_values[0, 0, 0].item() == pytest.approx(1.5)
    assert tree.children_values[0, 1, 1].item() == pytest.approx(4.0)
    torch.testing.assert_close(qvalues(tree, torch.tensor([0])), torch.tensor([[1 + 0.5 * 1.5, 0.0]]))


def test_backup_ignores_inactive_trees():
    tree, fn = two_step_tree()
    n1 = expand(tree, fn, torch.tensor([[0]]), torch.tensor([[0]]), torch.ones(1, 1, dtype=torch.bool))
    backup(tree, n1[:, 0], torch.tensor([False]))
    assert tree.node_visits[0, 0].item() == 1 and tree.children_visits.sum().item() == 0


def test_select_path_descends_existing_children_and_stops_at_new_edge():
    tree, fn = two_step_tree()
    one = torch.ones(1, 1, dtype=torch.bool)
    n1 = expand(tree, fn, torch.tensor([[0]]), torch.tensor([[0]]), one)
    backup(tree, n1[:, 0], torch.tensor([True]))
    # Root rule forced to action 0, interior rule to action 1: the path is root -a0-> 1 -a1-> new.
    path = select_path(
        tree,
        root_action_selection_fn=lambda s, g: torch.zeros_like(s.depth),
        interior_action_selection_fn=lambda s, g: torch.ones_like(s.depth),
        active=torch.tensor([True]),
    )
    assert path.status.tolist() == [NEW] and path.parent.tolist() == [1] and path.action.tolist() == [1]
    assert path.path_nodes.tolist() == [[0, 1]] and path.path_actions.tolist() == [[0, 1]]
    # With max_depth = 1 node 1 is a leaf: the path revisits it.
    path = select_path(
        tree,
        root_action_selection_fn=lambda s, g: torch.zeros_like(s.depth),
        interior_action_selection_fn=lambda s, g: torch.ones_like(s.depth),
        active=torch.tensor([True]),
        max_depth=1,
    )
    assert path.status.tolist() == [REVISIT] and path.leaf.tolist() == [1]


def test_terminal_child_value_is_its_reward_and_is_never_expanded():
    root = RootInput(prior_logits=torch.zeros(1, 2), value=torch.tensor([0.0]), handle=torch.tensor([1]))
    table = {(1, 0): (0.7, 0.9, [0.5, 0.5], 123.0, True), (1, 1): (0.2, 0.9, [0.5, 0.5], 0.0, False)}
    table.update({(12, a): (0.0, 0.9, [0.5, 0.5], 0.0, True) for a in range(2)})
    fn = scripted_expand(table, 2)
    out = mcts.muzero_policy(root, fn, num_simulations=12, dirichlet_fraction=0.0, seed=0)
    tree = out.search_tree
    node = tree.children_index[0, 0, 0].item()
    assert tree.terminal[0, node] and tree.node_values[0, node].item() == 0.0
    assert (tree.children_index[0, node] == UNVISITED).all()
    assert qvalues(tree, torch.tensor([0]))[0, 0].item() == pytest.approx(0.7)
    assert tree.children_discounts[0, 0, 0].item() == 0.0
    assert tree.node_visits[0, node].item() == tree.children_visits[0, 0, 0].item() > 1


def test_backup_path_equals_backup_exactly():
    from mcts.search import DROPPED, backup_path
    from mcts.synthetic import SyntheticEnv

    env = SyntheticEnv(num_actions=4, depth=4, discount=0.9)
    tree = mcts.muzero_policy(env.root(6), env.expand, num_simulations=20, max_nodes=60).search_tree
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        path = select_path(
            tree,
            root_action_selection_fn=mcts.puct_action_selection,
            interior_action_selection_fn=mcts.puct_action_selection,
            active=torch.ones(6, dtype=torch.bool),
            generator=gen,
        )
        assert not (path.status == DROPPED).any()
        is_new = path.status == NEW
        new_index = expand(tree, env.expand, path.parent[:, None], path.action[:, None], is_new[:, None])[:, 0]
        leaf = torch.where(is_new, new_index, path.leaf)
        rows = torch.arange(6)
        tree.node_visits[rows, leaf] += (path.status == REVISIT).long()
        a = mcts.Tree(**{k: v.clone() for k, v in tree.tensors().items()})
        backup(tree, leaf, torch.ones(6, dtype=torch.bool))
        backup_path(a, path, leaf, torch.ones(6, dtype=torch.bool))
        for name, t in tree.tensors().items():
            assert torch.equal(t, a.tensors()[name]), name
