"""Keys/values and the attention the `hf` backend runs its forwards with.

The model's own modules (projections, rotary embedding, norms, MLP) run unchanged; only the
attention is swapped, through transformers' `AttentionInterface`, for `blocked_attention`:

- Rows are grouped: every row of a group shares one copy of a prompt prefix's keys/values
  (`Attend.prefix`, `[layers, 2, groups, kv_heads, blocks * ATTN_BLOCK, head_dim]`), and each row
  has its own suffix (`Attend.suffix`: the tokens it generated, or a scored continuation, or the
  block of prompt being encoded). So the K samples of a prompt read its keys/values once, not
  K times, and grouped-query heads are never repeated.
- Batch invariance: a row's numbers do not depend on which other rows share the forward.
  Every reduction over keys runs over fixed blocks (ATTN_BLOCK prefix keys, SUFFIX_BLOCK suffix
  keys; padding keys score -inf), and block sums are added in order, so the empty blocks a
  shorter row gets when padded to the longest one add exact zeros. Matrix products have fixed per-matrix shapes or
  at least 4 rows, and forwards run a multiple of ROW_MULTIPLE rows: on the MKL CPU build in use
  a row of such a product is bitwise the same whatever the other rows, their number (>= 4) and
  its position (tests/test_policy.py checks the whole path).
- Canonical prompt keys/values: a prompt is encoded in blocks of CACHE_BLOCK tokens, one forward
  per block after the blocks before it, so the keys/values of a prefix are a function of its
  tokens alone, whether they come from `PrefixCache` or are computed now.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

ATTN_BLOCK = 128  # prefix keys per attention block
SUFFIX_BLOCK = 32  # suffix keys per attention block
CACHE_BLOCK = 32  # prompt tokens per prefix-cache block (and per encoding forward)
ROW_MULTIPLE = 4  # forwards run a multiple of this many rows
ATTENTION_NAME = "dataengine_blocked"


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class Attend:
    """What `blocked_attention` reads and writes during one forward.

    prefix: `[layers, 2, P, kv_heads, nb * ATTN_BLOCK, head_dim]` keys/values of the P groups'
        prefixes (finite, zeros or not, past each prefix's end), or None.
    lengths: `[P]` real prefix length of each group.
    shared: the first `shared` positions (a multiple of ATTN_BLOCK) are the same for every row's
        group; all rows attend to them in one product over group `shared_from`'s copy.
    slots: query slots per group (G).
    scatter: `[n]` flat slot (group * G + slot) of each row; P * G for rows outside any group
        (padding rows, whose outputs are ignored).
    suffix: `[layers, 2, n, kv_heads, cap, head_dim]` each row's own keys/values (cap a multiple of
        SUFFIX_BLOCK, zeros where unwritten); a forward of T tokens writes positions
        [start, start + T) of every row, or [start[i], start[i] + T) of row i.
    """

    def __init__(
        self,
        suffix: torch.Tensor,
        start: int | Sequence[int] = 0,
        prefix: torch.Tensor | None = None,
        lengths: Sequence[int] = (),
        slots: int = 1,
        scatter: Sequence[int] = (),
        shared: int = 0,
        shared_from: int = 0,
    ):
        self.suffix = suffix
        self.start: int = 0
        self.starts: torch.Tensor | None = None
        if isinstance(start, int):
            self.start = start
        else:
            self.starts = torch.tensor(list(start), dtype=torch.long, device=suffix.device)
            self.start = int(self.starts.max())
        self.prefix, self.slots, self.shared, self.shared_from = None, slots, 0, shared_from
        self._suffix_bias: tuple[tuple[int, int, int], torch.Tensor] | None = None
        if prefix is not None:
            self.set_prefix(prefix, lengths, scatter, shared)

    def set_prefix(self, prefix: torch.Tensor, lengths: Sequence[int], scatter: Sequence[int], shared: int = 0) -> None:
        if shared % ATTN_BLOCK or shared > prefix.shape[4]:
            raise ValueError(f"shared prefix {shared} must be a multiple of {ATTN_BLOCK} within the prefix")
        dev = prefix.device
        self.prefix, self.shared = prefix, shared
        p, width = prefix.shape[2], prefix.shape[4]
        key = torch.arange(shared, width, device=dev)[None, :]
        pad = key >= torch.tensor(list(lengths), device=dev)[:, None]
        zero = torch.zeros((), dtype=prefix.dtype, device=dev)
        self.prefix_bias = torch.where(pad, float("-inf"), zero).view(p, 1, 1, width - shared)
        self.set_rows(scatter)

    def set_rows(self, scatter: Sequence[int]) -> None:
        """Slot of each row: `scatter[i]` = group * slots + slot (P * slots: none)."""
        dev = self.suffix.device
        flat = torch.tensor(list(scatter), dtype=torch.long, device=dev)
        self.group, self.slot = flat // self.slots, flat % self.slots  # writes (group P: nowhere)
        self.group_in = self.group.clamp(max=max(0, self.prefix.shape[2] - 1)) if self.prefix is not None else None

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> int:
        """Store `key`/`value` `[n, kv_heads, T, d]` in the suffix; returns the suffix keys to read."""
        t = key.shape[2]
        if self.starts is None:
            self.suffix[layer, 0, :, :, self.start : self.start + t] = key
            self.suffix[layer, 1, :, :, self.start : self.start + t] = value
        else:
            rows = torch.arange(key.shape[0], device=key.device)[:, None]
            pos = self.starts[:, None] + torch.arange(t, device=key.device)[None, :]
            self.suffix[layer, 0][rows, :, pos] = key.transpose(1, 2)
            self.suffix[layer, 1][rows, :, pos] = value.transpose(1, 2)
        return self.start + t

    def suffix_bias(self, t: int, rep: int, blocks: int) -> torch.Tensor:
        """`[1 or n, 1, rep * t, blocks * SUFFIX_BLOCK]`: query (head r, token i) of a row sees
        the row's suffix keys <= its start + i."""
        shape = (self.start, t, rep)
        if self._suffix_bias is None or self._suffix_bias[0] != shape:
            dev = self.suffix.device
            key = torch.arange(blocks * SUFFIX_BLOCK, device=dev)[None, None, :]
            starts = self.starts[:, None, None] if self.starts is not None else self.start
            query = starts + torch.arange(t, device=dev).repeat(rep)[None, :, None]
            zero = torch.zeros((), dtype=self.suffix.dtype, device=dev)
            bias = torch.where(key > query, float("-inf"), zero)[:, None]
            self._suffix_bias = (shape, bias)
        return self._suffix_bias[1]


def _blocks(weights: torch.Tensor, values: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per key block: sums of `weights` `[..., M, nb * block]` -> `[..., M, nb]`, and weighted sums
    of `values` `[..., nb * block, d]` -> `[..., nb, M, d]`."""
    *lead, m, width = weights.shape
    nb = width // block
    blocked = weights.view(*lead, m, nb, block)
    return blocked.sum(-1), torch.matmul(blocked.transpose(-3, -2), values.view(*lead, nb, block, values.shape[-1]))


def blocked_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of `query` `[n, heads, T, d]` over the shared prefix, each row's group prefix and
    its own causal suffix, after writing `key`/`value` `[n, kv_heads, T, d]` into the suffix.
    Returns `[n, T, heads, d]` (the layout transformers' attention functions return).

    One max per query over all its keys, then exp, then sums block by block in key order: the
    result does not depend on how keys are split between the shared and group parts."""
    at: Attend | None = kwargs.get("attend")
    if at is None:
        raise RuntimeError(
            "blocked_attention ran without an Attend: the model was used elsewhere while an hf policy call had it switched on"
        )
    layer = module.layer_idx
    n, heads, t, d = query.shape
    kvh = key.shape[1]
    r = heads // kvh * t  # queries per kv head and row
    used = at.write(layer, key, value)
    q = (query * (d**-0.5 if scaling is None else scaling)).reshape(n, kvh, r, d)

    nbs = -(-used // SUFFIX_BLOCK)
    scores = torch.matmul(q, at.suffix[layer, 0, :, :, : nbs * SUFFIX_BLOCK].transpose(-1, -2))
    scores += at.suffix_bias(t, heads // kvh, nbs)
    top = scores.amax(-1)  # [n, kvh, r]
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (sums [n, kvh, r, nb], outs [n, kvh, r, nb, d])
    if at.prefix is not None:
        p, g, ws = at.prefix.shape[2], at.slots, at.shared
        keys, values = at.prefix[layer, 0], at.prefix[layer, 1]
        grouped = ws < keys.shape[2]

        def rows(x: torch.Tensor) -> torch.Tensor:
            """`[p, kvh, g * r, ...]` by group slot -> `[n, kvh, r, ...]` by row."""
            return x.view(p, kvh, g, r, *x.shape[3:])[at.group_in, :, at.slot]

        def slots(x: torch.Tensor) -> torch.Tensor:
            """`[n, kvh, r, ...]` by row -> `[p, kvh, g * r, ...]` by group slot (empty slots zero)."""
            grid = x.new_zeros((p + 1, kvh, g, r, *x.shape[3:]))
            grid[at.group, :, at.slot] = x
            return grid[:p].view(p, kvh, g * r, *x.shape[3:])

        if ws:
            scores_s = torch.matmul(q.transpose(0, 1).reshape(kvh, n * r, d), keys[at.shared_from, :, :ws].transpose(-1, -2))
            top = torch.maximum(top, scores_s.amax(-1).view(kvh, n, r).transpose(0, 1))
        if grouped:
            scores_g = torch.matmul(slots(q), keys[:, :, ws:].transpose(-1, -2))
            scores_g += at.prefix_bias
            top = torch.maximum(top, rows(scores_g.amax(-1)))
        if ws:
            weights = scores_s.sub_(top.transpose(0, 1).reshape(kvh, n * r)[..., None]).exp_()
            sums, outs = _blocks(weights, values[at.shared_from, :, :ws], ATTN_BLOCK)
            nb = sums.shape[-1]
            parts.append((sums.view(kvh, n, r, nb).transpose(0, 1), outs.view(kvh, nb, n, r, d).permute(2, 0, 3, 1, 4)))
        if grouped:
            weights = scores_g.sub_(slots(top)[..., None]).exp_()
            sums, outs = _blocks(weights, values[:, :, ws:], ATTN_BLOCK)
            nb = sums.shape[-1]
            outs = outs.view(p, kvh, nb, g, r, d)[at.group_in, :, :, at.slot]  # [n, kvh, nb, r, d]
            parts.append((rows(sums), outs.transpose(2, 3)))
    weights = scores.sub_(top[..., None]).exp_()
    sums, outs = _blocks(weights, at.suffix[layer, 1, :, :, : nbs * SUFFIX_BLOCK], SUFFIX_BLOCK)
    parts.append((sums, outs.transpose(2, 3)))
    total, out = parts[0][0][..., 0], parts[0][1][..., 0, :]
    for i, (sums, outs) in enumerate(parts):
        for b in range(1 if i == 0 else 0, sums.shape[-1]):
            total = total + sums[..., b]
            out = out + outs[..., b, :]
    out = out / total[..., None]
    return out.reshape(n, heads, t, d).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, blocked_attention)


_register()


LINEAR_ROWS = 16  # products as weight @ input^T get at least this many rows (a multiple of 4)
# ... and at most this many: on an AVX-512/AMX Xeon, MKL's 576 x 1536 product (SmolLM2's MLP
# down projection) gives a row other bits from 60 rows up, the same bits for 16-56 rows.
LINEAR_CHUNK = 48


@contextmanager
def blocked_attention_on(model: Any, weight_first: bool = False) -> Iterator[None]:
    """Run `model`'s forwards with `blocked_attention` inside the block (restored after).

    weight_first: also compute the base model's linear layers as weight @ input^T over at least
    LINEAR_ROWS rows (`weight_first_linear`)."""
    config = model.config
    before = config._attn_implementation
    patched: list[tuple[torch.nn.Module, Any]] = []
    config._attn_implementation = ATTENTION_NAME
    try:
        if weight_first:
            for module in model.base_model.modules():
                if type(module) is torch.nn.Linear:
                    patched.append((module, module.__dict__.get("forward")))
                    module.forward = weight_first_linear(module)
        yield
    finally:
        config._attn_implementation = before
        for module, forward in patched:
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def weight_first_linear(module: torch.nn.Linear) -> Any:
    """`module`'s forward as weight @ input^T: on the MKL CPU build in use this streams the
    weights faster than input @ weight^T for 16 rows and more (20-30% on 2 threads), and a row's
    output is bitwise the same for any number of rows from LINEAR_ROWS to LINEAR_CHUNK and any
    position; longer inputs run in products of LINEAR_CHUNK rows."""
    weight, bias = module.weight, module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        m = flat.shape[0]
        rows = max(LINEAR_ROWS, round_up(m, ROW_MULTIPLE))
        if rows > m:
            flat = torch.cat([flat, flat.new_zeros((rows - m, flat.shape[1]))])
        if rows <= LINEAR_CHUNK:
            out = torch.matmul(weight, flat.T).T[:m].contiguous()
        else:
            chunks = [flat[i : i + LINEAR_CHUNK] for i in range(0, rows, LINEAR_CHUNK)]
            last = chunks[-1].shape[0]
            if last < LINEAR_ROWS:  # rows and LINEAR_CHUNK are multiples of 4: pad only to LINEAR_ROWS
                chunks[-1] = torch.cat([chunks[-1], flat.new_zeros((LINEAR_ROWS - last, flat.shape[1]))])
            out = torch.cat([torch.matmul(weight, c.T).T for c in chunks])[:m].contiguous()
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], weight.shape[0])

    return forward


def check_supported(model: Any) -> None:
    """A clear error for models `blocked_attention` cannot serve (it has no sliding window,
    soft-capping or non-causal attention)."""
    config = model.config
    name = type(model).__name__
    if hasattr(model, "_can_set_attn_implementation") and not model._can_set_attn_implementation():
        raise ValueError(f"{name} does not use transformers' AttentionInterface; the hf policy backend needs it")
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types) or getattr(config, "attn_logit_softcapping", None):
        raise ValueError(f"{name} uses sliding-window or soft-capped attention, which the hf policy backend does not support")


class PrefixCache:
    """LRU of encoded prompt blocks: a digest of all tokens up to a block's end -> that block's
    keys/values `[layers, 2, kv_heads, n, head_dim]` (n <= CACHE_BLOCK).

    A block shorter than CACHE_BLOCK (the end of a prompt) is also found by `partial`, so a longer
    prompt that starts with that prompt reuses it.
    max_tokens: total cached positions kept (memory is about max_tokens * layers * 2 * kv_heads *
        head_dim * 4 bytes; 46 KB per position for SmolLM2-135M in float32).
    """

    def __init__(self, max_tokens: int = 16384):
        self.max_tokens = max_tokens
        # digest -> (keys/values, digest before the block, the block's tokens if it is short)
        self.entries: OrderedDict[bytes, tuple[torch.Tensor, bytes, tuple[int, ...] | None]] = OrderedDict()
        self.short: dict[bytes, dict[bytes, tuple[int, ...]]] = {}  # digest before -> short blocks after it
        self.ends: dict[bytes, torch.Tensor] = {}  # logits after the blocks that ended a prompt
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: bytes) -> torch.Tensor | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.entries.move_to_end(key)
        return entry[0]

    def logits(self, key: bytes) -> torch.Tensor | None:
        """The logits after the block `key` ends, if a prompt ended there."""
        return self.ends.get(key) if key in self.entries else None

    def set_logits(self, key: bytes, logits: torch.Tensor) -> None:
        if key in self.entries:
            self.ends[key] = logits

    def partial(self, before: bytes, rest: Sequence[int]) -> tuple[int, torch.Tensor | None]:
        """The longest short block after the block chain `before` whose tokens start `rest`:
        (its length, its keys/values), or (0, None)."""
        best: tuple[int, bytes | None] = (0, None)
        for key, tokens in self.short.get(before, {}).items():
            if best[0] < len(tokens) <= len(rest) and tuple(rest[: len(tokens)]) == tokens:
                best = (len(tokens), key)
        return (best[0], self.get(best[1])) if best[1] is not None else (0, None)

    def put(self, key: bytes, kv: torch.Tensor, before: bytes = b"", tokens: Sequence[int] | None = None) -> None:
        """Store a block; `before` (the digest ending the previous block) and `tokens` for a short block."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        short = tuple(tokens) if tokens is not None and len(tokens) < CACHE_BLOCK else None
        self.entries[key] = (kv, before, short)
        if short is not None:
            self.short.setdefault(before, {})[key] = short
        self.tokens += kv.shape[3]
        while self.tokens > self.max_tokens and len(self.entries) > 1:
            old_key, (old, old_before, old_short) = self.entries.popitem(last=False)
            self.tokens -= old.shape[3]
            self.ends.pop(old_key, None)
            if old_short is not None:
                self.short[old_before].pop(old_key, None)
                if not self.short[old_before]:
                    del self.short[old_before]

    def clear(self) -> None:
        self.entries.clear()
        self.short.clear()
        self.ends.clear()
        self.tokens = 0


def block_keys(ids: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """(start, end, digest of ids[:end]) of each CACHE_BLOCK piece of `ids` (the last may be shorter)."""
    arr = np.asarray(ids, dtype=np.int64)
    out = []
    digest = b""
    for start in range(0, len(arr), CACHE_BLOCK):
        end = min(start + CACHE_BLOCK, len(arr))
        digest = hashlib.blake2b(digest + arr[start:end].tobytes(), digest_size=16).digest()
        out.append((start, end, digest))
    return out
