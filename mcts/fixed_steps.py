"""The fixed-step runner of mcts.search (one leaf per iteration): selection and backup take a
fixed number of steps and touch only tensors that live across calls, so `mcts.runners`
can replay them as CUDA graphs (`CudaGraphs`) or run them through torch.compile (`Compiled`);
replay None runs the same steps eagerly. Deep walks run in pieces (`pieces.Walk`, `climb`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from mcts.base import ExpandFn, WidenFn
from mcts.expansion import expand_dense, expand_with_stop, widen_on_paths
from mcts.pieces import SelectedPath, Walk, backup, climb, masked, start_climb
from mcts.runners import Compiled, CudaGraphs
from mcts.tree import UNVISITED, Tree


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def search_fixed_steps(
    tree: Tree,
    expand_fn: ExpandFn,
    *,
    walk_fn: Callable[..., tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]],
    done: torch.Tensor,
    target: torch.Tensor,
    max_depth: int | None,
    widen_fn: WidenFn | None,
    generator: torch.Generator | None,
    replay: CudaGraphs | Compiled | None,
    step_bucket: int,
    unroll: int,
    long_walk: int,
    piece_steps: int,
) -> None:
    """search() with one leaf per iteration, written for CUDA graphs: selection and backup read
    and write fixed tensors and take a fixed number of steps (the deepest node's depth + 1,
    rounded up to step_bucket and capped by max_depth), so each is one graph per walk length.
    Between them the expand function and widening run eagerly; when the expand function is
    marked `graph_safe` and nothing widens, unroll whole iterations (select, expand, backup)
    are one graph. Past long_walk steps the selection and the backup run in pieces (walk_fn is
    walk_steps with the rules bound). replay None runs the same steps eagerly (CPU).
    step_bucket, unroll, long_walk, piece_steps: mcts.search's STEP_BUCKET, UNROLL, LONG_WALK
    and PIECE, read there at each search."""
    b, n = tree.batch_size, tree.max_nodes
    long_walk = long_walk if b > 1 else 2 * long_walk
    rows = torch.arange(b, device=tree.device)
    # What the backup reads: copied here by the selection, by the caller from the expansion.
    new_index = torch.full((b, 1), UNVISITED, dtype=torch.int64, device=tree.device)
    stopped = torch.zeros(b, dtype=torch.bool, device=tree.device)
    old_leaf = torch.full((b,), UNVISITED, dtype=torch.int64, device=tree.device)
    new, revisit = torch.zeros_like(stopped), torch.zeros_like(stopped)
    # A walk or a climb in pieces keeps its state here between calls.
    walk_state = Walk.start(tree, stopped)
    climb_state = (old_leaf.clone(), torch.zeros(b, dtype=tree.node_values.dtype, device=tree.device), stopped.clone())

    def settle(walk: Walk, ended: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """What the walk's end asks of the expansion and the backup. `ended`: a 0-dim bool, False
        where the walk may not have ended yet: then it asks nothing and changes nothing."""
        is_new, is_revisit = walk.new & (tree.num_nodes < n), walk.revisit
        if ended is not None:
            is_new, is_revisit = is_new & ended, is_revisit & ended
        # Nothing selectable: the tree is full.
        done.logical_or_(~(is_new | is_revisit) if ended is None else ended & ~(is_new | is_revisit))
        old_leaf.copy_(walk.leaf)
        new.copy_(is_new)
        revisit.copy_(is_revisit)
        return is_new, is_revisit

    def choose(steps: int, gen: Any) -> tuple[SelectedPath, torch.Tensor, torch.Tensor]:
        walk = Walk.start(tree, ~done & (tree.num_simulations < target))
        path = walk.path(*walk_fn(tree, walk, steps=steps, generator=gen))
        return (path, *settle(walk))

    # Only widening reads a walk's path; without it a piece returns just whether a walk goes on.
    keep_path = widen_fn is not None

    def walk_piece(steps: int, gen: Any, first: bool = False) -> tuple[torch.Tensor, ...]:
        walk = Walk.start(tree, ~done & (tree.num_simulations < target)) if first else dataclasses.replace(walk_state)
        nodes, actions, masks = walk_fn(tree, walk, steps=steps, generator=gen, at_root=first)
        # Stacked before walk_state is written: a continued piece's first node is walk_state.node.
        path = (torch.stack(nodes, 1), torch.stack(actions, 1), torch.stack(masks, 1)) if keep_path else ()
        for field in dataclasses.fields(Walk):
            getattr(walk_state, field.name).copy_(getattr(walk, field.name))
        return *path, walk.running.any()

    def walk_first(steps: int, gen: Any) -> tuple[torch.Tensor, ...]:
        return walk_piece(steps, gen, first=True)

    def walk_in_pieces() -> list[list[torch.Tensor]]:
        """Walk in pieces until every walk has ended; the walk is left in walk_state. Returns each
        piece's nodes, actions and masks (`[B, piece_steps]`) when keep_path."""
        *piece, going = run("walk_first", walk_first, piece_steps)
        pieces = [[t.clone() for t in piece]]  # cloned: a graph's outputs are overwritten by its next replay
        while bool(going):
            *piece, going = run("walk_more", walk_piece, piece_steps)
            pieces.append([t.clone() for t in piece])
        return pieces

    def leaf_visits() -> torch.Tensor:
        """Each tree's leaf, after counting a visit to a revisited one."""
        leaf = torch.where(new, new_index[:, 0], old_leaf)
        safe = leaf.clamp_min(0)
        tree.node_visits[rows, safe] = tree.node_visits[rows, safe] + revisit.long()
        return leaf

    def back_up(steps: int, gen: Any = None) -> None:
        backup(tree, leaf_visits(), new | revisit, steps=steps)
        done.logical_or_(stopped | (tree.num_simulations >= target))

    def climb_piece(steps: int, gen: Any = None, first: bool = False) -> torch.Tensor:
        state = start_climb(tree, leaf_visits(), new | revisit) if first else climb_state
        state = climb(tree, *state, steps)
        for t, value in zip(climb_state, state):
            t.copy_(value)
        # Before the last piece this changes nothing: the root's visits (num_simulations) grow there.
        done.logical_or_(stopped | (tree.num_simulations >= target))
        return state[2].any()

    def climb_first(steps: int, gen: Any = None) -> torch.Tensor:
        return climb_piece(steps, gen, first=True)

    def climb_on(going: Any) -> None:
        """Climb in pieces until no tree climbs; `going`: whether one did in the last piece."""
        while bool(going):
            going = run("climb_more", climb_piece, piece_steps)

    run = replay or (lambda name, fn, steps: fn(steps, generator))
    deepest = int(tree.depth.max())

    def walk_length(extra: int) -> int:
        walk = round_up(deepest + extra, step_bucket)
        return walk if max_depth is None else min(walk, max_depth)

    in_pieces = False  # once walks are long they stay long: trees only deepen
    if widen_fn is None and getattr(expand_fn, "graph_safe", False):
        # The expand function is capturable too: whole iterations are one graph, and the host
        # reads three numbers per replay (all done, deepest node, NaN seen).
        nan = torch.zeros(2, dtype=torch.bool, device=tree.device)
        status = torch.zeros(3, dtype=torch.int64, device=tree.device)

        def iterate(steps: int, gen: Any) -> torch.Tensor:
            for _ in range(unroll):
                path, is_new, _ = choose(steps, gen)
                index, stop = expand_dense(tree, expand_fn, path.parent, path.action, is_new, nan)
                new_index.copy_(index.unsqueeze(-1))
                stopped.copy_(stop)
                back_up(steps)
            status.copy_(torch.stack([done.all().long(), tree.depth.max(), nan[0].long() * 2 + nan[1].long()]))
            return status

        def expand_climb(steps: int, gen: Any = None, walking: torch.Tensor | None = None) -> torch.Tensor:
            # After a walk in pieces: the rest of an iteration, up to the backup's first piece.
            ended = None if walking is None else ~walking
            is_new, _ = settle(walk_state, ended)
            index, stop = expand_dense(tree, expand_fn, walk_state.parent, walk_state.action, is_new, nan)
            new_index.copy_(index.unsqueeze(-1))
            stopped.copy_(stop if ended is None else stop & ended)
            going = climb_piece(steps, first=True)
            walking = torch.zeros_like(going) if walking is None else walking
            status.copy_(torch.stack([walking.long(), going.long(), nan[0].long() * 2 + nan[1].long()]))
            return status

        def walk_expand_climb(steps: int, gen: Any) -> torch.Tensor:
            # A walk's first piece, and where every walk ended in it (most iterations) the rest
            # of the iteration too: one call. Else the expansion and the climb see no tree.
            return expand_climb(steps, gen, walking=walk_first(steps, gen)[-1])

        def check(flags: int) -> None:
            if flags:
                raise ValueError(f"ExpandOutput.{'prior_logits' if flags & 2 else 'value'} holds NaN"
                                 + ("; use -inf for missing actions" if flags & 2 else ""))

        all_done = bool(done.all())
        # Deep trees go on one iteration at a time below, walking in pieces.
        while not all_done and walk_length(unroll) <= long_walk:
            all_done, deepest, flags = run("iterate", iterate, walk_length(unroll)).tolist()
            check(flags)
        # Deep trees: one iteration at a time, the walk and the backup in pieces.
        while not bool(done.all()):
            walking, going, flags = run("walk_expand_climb", walk_expand_climb, piece_steps).tolist()
            check(flags)
            if walking:
                while walking:
                    walking = bool(run("walk_more", walk_piece, piece_steps)[-1])
                _, going, flags = run("expand_climb", expand_climb, piece_steps).tolist()
                check(flags)
            climb_on(going)
        return
    while not bool(done.all()):
        in_pieces = in_pieces or walk_length(1) > long_walk
        if in_pieces:
            pieces = walk_in_pieces()
            path = walk_state.path(*(list(torch.cat(part, 1).unbind(1)) for part in zip(*pieces))) if keep_path else None
            is_new, is_revisit = settle(walk_state)
            parent, action = walk_state.parent, walk_state.action
        else:
            path, is_new, is_revisit = run("select", choose, walk_length(1))
            parent, action = path.parent, path.action
        if bool(is_new.any()):
            index, stop = expand_with_stop(tree, expand_fn, parent[:, None], action[:, None], is_new[:, None])
            new_index.copy_(index)
            stopped.copy_(stop)
            deepest = int(tree.depth.max())
        else:
            new_index.fill_(UNVISITED)
            stopped.fill_(False)
        if in_pieces or round_up(deepest, step_bucket) > long_walk:
            climb_on(run("climb_first", climb_first, piece_steps))
        else:
            run("backup", back_up, round_up(deepest, step_bucket))
        if widen_fn is not None:
            widen_on_paths(tree, widen_fn, [masked(path, is_new | is_revisit)], done)
