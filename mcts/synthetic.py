"""A cheap deterministic environment with a known best path, for tests and benchmarks.

A state is an int64 handle: bits 56-62 hold its depth, bit 55 whether every action so far
followed the hidden correct path, bits 0-31 a hash of the path. Episodes end at `depth`; the
terminal reward is 1 on the correct path and 0 elsewhere. Priors and value estimates are
hash-derived noise with a mild hint towards the correct action, so search has work to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcts.base import ExpandOutput, RootInput

_DEPTH_SHIFT = 56
_CORRECT_BIT = 1 << 55
_HASH_MASK = (1 << 32) - 1
_MUL = 0x45D9F3B  # < 2**27: a 32-bit value times it stays below 2**59
_UNIT_BITS = 20


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply, a bijection on 32 bits) whose products never
    overflow int64. Compiled C++ treats signed overflow as undefined and gcc -O3 then computes
    other values than eager torch's wraparound, so a wrapping hash changes once compiled.
    Only `&`, `^`, `>>` and `*`: Python ints and int64 arrays of other libraries (the
    benchmark's plain-Python and JAX copies of this environment) hash the same."""
    x = x & _HASH_MASK
    x = ((x ^ (x >> 16)) * _MUL) & _HASH_MASK
    x = ((x ^ (x >> 16)) * _MUL) & _HASH_MASK
    return x ^ (x >> 16)


def _unit(h: torch.Tensor, salt: int) -> torch.Tensor:
    """Uniform-looking float in [0, 1) from a hash and a salt; a power-of-two scale, so exact
    whatever fuses or reorders it."""
    return (_mix(h + salt) & ((1 << _UNIT_BITS) - 1)).to(torch.float32) * 2.0**-_UNIT_BITS


@dataclass(frozen=True)
class SyntheticEnv:
    """A K-action tree of the given depth with one rewarded path.

    num_actions: K. depth: actions per episode. invalid_fraction: share of non-correct actions
    given -inf prior logits (missing) at each node. prior_hint: logit bonus of the correct
    action. discount: per-step discount. seed: selects the correct path and the noise.
    """

    num_actions: int = 8
    depth: int = 6
    invalid_fraction: float = 0.25
    prior_hint: float = 1.0
    discount: float = 1.0
    seed: int = 0

    def correct_action(self, depth: torch.Tensor) -> torch.Tensor:
        """`[...]` the rewarded action at each depth."""
        return _mix(depth + 1000 * (self.seed + 1)) % self.num_actions

    def _node_outputs(self, handle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prior logits `[..., K]` and value estimate `[...]` of the nodes with these handles."""
        depth = handle >> _DEPTH_SHIFT
        correct = (handle & _CORRECT_BIT) != 0
        h = handle & _HASH_MASK
        k = torch.arange(self.num_actions, device=handle.device)
        hk = h.unsqueeze(-1) * (self.num_actions + 1) + k
        logits = 2.0 * _unit(hk, 1) - 1.0
        best = self.correct_action(depth).unsqueeze(-1) == k
        logits = logits + self.prior_hint * best.to(logits.dtype)
        missing = (_unit(hk, 2) < self.invalid_fraction) & ~best
        logits = logits.masked_fill(missing, float("-inf"))
        value = 0.4 * _unit(h, 3) + 0.4 * correct.to(torch.float32)
        return logits, value

    def root(self, batch_size: int, device: torch.device | str = "cpu") -> RootInput:
        """B distinct roots (depth 0, on the correct path)."""
        ids = torch.arange(batch_size, device=device, dtype=torch.int64)
        handle = _mix(ids + 7 * (self.seed + 1)) | _CORRECT_BIT
        logits, value = self._node_outputs(handle)
        return RootInput(prior_logits=logits, value=value, handle=handle)

    def expand(self, parent_handles: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> ExpandOutput:
        """The mcts.ExpandFn of this environment ([B, L] in, [B, L] and [B, L, K] out)."""
        del valid  # every slot is computed; the search ignores the invalid ones
        depth = (parent_handles >> _DEPTH_SHIFT) + 1
        on_path = ((parent_handles & _CORRECT_BIT) != 0) & (actions == self.correct_action(depth - 1))
        h = _mix((parent_handles & _HASH_MASK) * (self.num_actions + 1) + actions + 1)
        handle = (depth << _DEPTH_SHIFT) | (on_path.long() * _CORRECT_BIT) | h
        logits, value = self._node_outputs(handle)
        terminal = depth >= self.depth
        reward = (terminal & on_path).to(torch.float32)
        return ExpandOutput(
            reward=reward,
            discount=torch.full_like(reward, self.discount),
            prior_logits=logits,
            value=value,
            handle=handle,
            terminal=terminal,
        )

    # Only tensor ops on its inputs, same shapes each call: mcts.search may capture it in a CUDA graph.
    expand.graph_safe = True  # type: ignore[attr-defined]
