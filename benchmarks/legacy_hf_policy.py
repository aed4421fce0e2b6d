"""The `hf` policy backend as it was at commit 0f76dae, before shared-prefix decoding: kept only
so benchmarks/bench_policy.py can measure the old path in the same run (mode "old"), and
tests/test_policy.py can check the new path samples the same tokens. Not used by the engine.

Old design: each distinct prompt encoded once into a token-keyed LRU (longest common prefix
reuse); for decoding, each prompt's keys/values are left-padded and copied K times, one row per
sample, and attention runs through transformers' sdpa over a 4-D mask.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataengine.policy.base import (
    STOP_STRINGS,
    Conversation,
    Policy,
    PolicyStats,
    Sample,
    Timer,
    check_sampling_args,
    conv_seeds,
    cut_at_stop,
)

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values `[1, kv_heads, L, head_dim]`


def _buffer_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], extra: int) -> Any:
    """A DynamicCache whose layers write new positions into preallocated buffers (room for
    `extra` more) instead of concatenating: a decode step no longer copies the whole cache."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            n, h, length, d = keys.shape
            self.buf_k = keys.new_empty((n, h, length + extra, d))
            self.buf_v = values.new_empty((n, values.shape[1], length + extra, values.shape[3]))
            self.buf_k[:, :, :length] = keys
            self.buf_v[:, :, :length] = values
            self.length = length
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._views()

        def _views(self) -> None:
            self.keys, self.values = self.buf_k[:, :, : self.length], self.buf_v[:, :, : self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            m = key_states.shape[2]
            if self.length + m > self.buf_k.shape[2]:
                grow = max(m, self.buf_k.shape[2])
                self.buf_k = torch.cat([self.buf_k, self.buf_k.new_empty(self.buf_k.shape[:2] + (grow,) + self.buf_k.shape[3:])], 2)
                self.buf_v = torch.cat([self.buf_v, self.buf_v.new_empty(self.buf_v.shape[:2] + (grow,) + self.buf_v.shape[3:])], 2)
            self.buf_k[:, :, self.length : self.length + m] = key_states
            self.buf_v[:, :, self.length : self.length + m] = value_states
            self.length += m
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.buf_k, self.buf_v = self.buf_k[indices], self.buf_v[indices]
            self._views()

    cache = DynamicCache()
    cache.layers = [BufferLayer(k, v) for k, v in layers]
    return cache


class PrefixCache:
    """LRU of encoded prompt prefixes: token ids -> per-layer keys/values `[1, kv_heads, L, head_dim]`.

    max_tokens: total cached positions kept (memory is about max_tokens * layers * 2 * kv_heads *
        head_dim * 4 bytes; 46 KB per position for SmolLM2-135M in float32).
    """

    def __init__(self, max_tokens: int = 16384):
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, KV]] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    def longest(self, ids: Sequence[int], limit: int) -> tuple[int, KV | None]:
        """The longest common prefix (at most `limit` tokens) of `ids` with any entry, and its KV."""
        query = np.asarray(ids[:limit], dtype=np.int64)
        best_len, best_key = 0, None
        for key, (arr, _) in self.entries.items():
            n = min(len(arr), len(query))
            if n <= best_len:
                continue
            diff = np.flatnonzero(arr[:n] != query[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_len:
                best_len, best_key = common, key
        if best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        kv = self.entries[best_key][1]
        return best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in kv]

    def put(self, ids: Sequence[int], kv: KV) -> None:
        key = tuple(ids)
        if not key or len(key) > self.max_tokens:
            return
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        self.entries[key] = (np.asarray(key, dtype=np.int64), kv)
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self.entries.popitem(last=False)
            self.tokens -= len(old)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


@dataclass
class _Row:
    """One forward row: cached prefix (`past` of `past_len` tokens) plus new tokens `rest`."""

    past: KV | None
    past_len: int
    rest: list[int]


class HFPolicy(Policy):
    """Policy over a transformers causal LM and its tokenizer (with a tool-aware chat template).

    prefix_reuse: encode each distinct prompt once and keep prefixes in the LRU (False encodes
        every row's whole prompt every call, as plain batched generation does).
    cache_tokens: size of the prefix LRU in token positions.
    min_shared_prefix: encode the common prefix of a batch's new prompts first when it is at
        least this many tokens longer than what the cache already holds.
    max_batch_tokens: bound on rows x new tokens per encoding forward (memory of one forward).
    max_batch_rows: most sequences decoded together (bounds the key/value memory).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        prefix_reuse: bool = True,
        cache_tokens: int = 16384,
        min_shared_prefix: int = 16,
        max_batch_tokens: int = 4096,
        max_batch_rows: int = 64,
        stop_strings: Sequence[str] = STOP_STRINGS,
    ):
        from dataengine.models import model_id

        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.prefix_reuse = prefix_reuse
        self.cache = PrefixCache(cache_tokens)
        self.min_shared_prefix = min_shared_prefix
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_rows = max_batch_rows
        self.stop_strings = tuple(stop_strings)
        self.model_id = model_id(model)
        self.stats = PolicyStats()
        self.eos_ids = _end_of_turn_ids(model, tokenizer)
        self.end_turn_id = self.eos_ids[0]

    @classmethod
    def load(
        cls,
        model: str = "smollm2",
        *,
        device: str = "cpu",
        dtype: Any = None,
        fewshot: str | bool | None = None,
        system: str | None = None,
        listing: str | None = None,
        **options: Any,
    ) -> HFPolicy:
        """Load `model` ("smollm2", "tiny" or a folder) on `device` ("auto" picks cuda when present).

        fewshot, system, listing: the prompt options (`chat_template.install_prompt_options`).
        """
        from dataengine.chat_template import install_prompt_options
        from dataengine.models import load_model

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        lm, tokenizer = load_model(model, device=device, dtype=dtype)
        install_prompt_options(tokenizer, fewshot=fewshot, system=system, listing=listing)
        return cls(lm, tokenizer, **options)

    # ---- rendering -------------------------------------------------------------------------

    def encode(self, conv: Conversation) -> list[int]:
        """Prompt token ids of `conv` (the chat template with the assistant header)."""
        ids = self.tokenizer.apply_chat_template(
            conv.chat(), tools=conv.openai_tools(), tokenize=True, add_generation_prompt=True, return_dict=False
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        if len(ids) < 2:
            raise ValueError("rendered prompt has fewer than 2 tokens; the chat template looks wrong")
        return ids

    # ---- public API ------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        convs: Sequence[Conversation],
        k: int,
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] = 0,
    ) -> list[list[Sample]]:
        check_sampling_args(k, max_new_tokens, temperature, top_p)
        if not convs:
            return []
        seeds = conv_seeds(seed, len(convs))
        with Timer(self.stats):
            self.stats.calls += 1
            prompts = [self.encode(c) for c in convs]
            out: list[list[Sample]] = [[] for _ in convs]
            # Rows: (conversation index, sample index); grouped so one decode batch stays bounded.
            rows = [(c, i) for c in range(len(convs)) for i in range(k)]
            for start in range(0, len(rows), self.max_batch_rows):
                chunk = rows[start : start + self.max_batch_rows]
                samples = self._generate(prompts, chunk, max_new_tokens, temperature, top_p, seeds)
                for (c, _), s in zip(chunk, samples):
                    out[c].append(s)
            self.stats.sequences += len(rows)
        return out

    @torch.no_grad()
    def score(self, convs: Sequence[Conversation], continuations: Sequence[str], *, end_turn: bool = True) -> list[Sample]:
        if len(convs) != len(continuations):
            raise ValueError(f"score needs one continuation per conversation: {len(convs)} != {len(continuations)}")
        if not convs:
            return []
        with Timer(self.stats):
            self.stats.calls += 1
            prompts = [self.encode(c) for c in convs]
            targets = []
            for text in continuations:
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                targets.append(ids + [self.end_turn_id] if end_turn else ids)
            if any(not t for t in targets):
                raise ValueError("cannot score an empty continuation with end_turn=False")
            pasts = self._encode_prompts(prompts, list(range(len(prompts))))
            rows = [_Row(pasts[i][0], len(p) - 1, [p[-1]] + t[:-1]) for i, (p, t) in enumerate(zip(prompts, targets))]
            logprobs = self._forward_rows(rows, targets=targets, keep_kv=False)[1]
            self.stats.scored_tokens += sum(len(t) for t in targets)
            result = []
            for text, t, lp in zip(continuations, targets, logprobs):
                lp = [float(x) for x in lp]
                result.append(Sample(text, tuple(t), tuple(lp), float(sum(lp)), len(t), "stop" if end_turn else "length"))
        return result

    # ---- encoding --------------------------------------------------------------------------

    def _encode_prompts(self, prompts: list[list[int]], wanted: list[int]) -> dict[int, tuple[KV, int]]:
        """Keys/values of `prompts[i][:-1]` for each i in `wanted`: {i: (kv, length)}."""
        heads = {i: tuple(prompts[i][:-1]) for i in wanted}
        distinct = list(dict.fromkeys(heads.values()))
        if not self.prefix_reuse:
            # Plain batched generation: every row encodes its whole prompt, nothing is kept.
            rows = [_Row(None, 0, list(heads[i])) for i in wanted]
            kvs = self._forward_rows(rows, keep_kv=True)[0]
            return {i: (kv, len(heads[i])) for i, kv in zip(wanted, kvs)}
        self._encode_shared_prefix(distinct)
        rows = []
        for head in distinct:
            hit, past = self.cache.longest(head, len(head))
            rows.append(_Row(past, hit, list(head[hit:])))
            self.stats.cached_tokens += hit
        todo = [r for r in rows if r.rest]
        kvs = iter(self._forward_rows(todo, keep_kv=True)[0])
        by_head = {}
        for head, row in zip(distinct, rows):
            kv = next(kvs) if row.rest else row.past
            self.cache.put(head, kv)
            by_head[head] = kv
        return {i: (by_head[heads[i]], len(heads[i])) for i in wanted}

    def _encode_shared_prefix(self, heads: list[tuple[int, ...]]) -> None:
        """Encode the common prefix of several new prompts once, so each then encodes only its rest."""
        if len(heads) < 2:
            return
        arrs = [np.asarray(h, dtype=np.int64) for h in heads]
        n = min(len(a) for a in arrs)
        same = np.all(np.stack([a[:n] for a in arrs]) == arrs[0][:n], axis=0)
        common = int(np.argmin(same)) if not same.all() else n
        hit, past = self.cache.longest(heads[0], common)
        if common - hit < self.min_shared_prefix:
            return
        self.stats.cached_tokens += hit
        kv = self._forward_rows([_Row(past, hit, list(heads[0][hit:common]))], keep_kv=True)[0][0]
        self.cache.put(heads[0][:common], kv)

    def _forward_rows(
        self, rows: list[_Row], *, targets: list[list[int]] | None = None, keep_kv: bool
    ) -> tuple[list[KV], list[list[float]]]:
        """Run the model on each row's `rest` after its cached `past`, in memory-bounded chunks.

        Returns per row: the keys/values of past+rest (if keep_kv) and, with `targets` (one id per
        rest position), the log-prob of each target.
        """
        kvs: list[KV] = [None] * len(rows)  # type: ignore[list-item]
        lps: list[list[float]] = [[] for _ in rows]
        order = sorted(range(len(rows)), key=lambda r: len(rows[r].rest) + rows[r].past_len)
        # Scoring materialises [rows, rest, vocab] logits, so it gets smaller chunks.
        budget = self.max_batch_tokens // (4 if targets is not None else 1)
        chunk: list[int] = []
        for r in order + [None]:  # type: ignore[list-item]
            if r is not None:
                width = max([len(rows[j].rest) + rows[j].past_len for j in chunk + [r]])
                if not chunk or width * (len(chunk) + 1) <= budget:
                    chunk.append(r)
                    continue
            if not chunk:
                break
            sub_targets = [targets[j] for j in chunk] if targets is not None else None
            got_kv, got_lp = self._forward_chunk([rows[j] for j in chunk], sub_targets, keep_kv)
            for j, kv, lp in zip(chunk, got_kv, got_lp):
                kvs[j], lps[j] = kv, lp
            chunk = [r] if r is not None else []
            if r is None:
                break
        return kvs, lps

    def _forward_chunk(
        self, rows: list[_Row], targets: list[list[int]] | None, keep_kv: bool
    ) -> tuple[list[KV | None], list[list[float]]]:
        from transformers import DynamicCache

        n = len(rows)
        tp = max(r.past_len for r in rows)
        tr = max(len(r.rest) for r in rows)
        dev = self.device
        ids = torch.full((n, tr), self.end_turn_id, dtype=torch.long, device=dev)
        pos = torch.zeros((n, tr), dtype=torch.long, device=dev)
        valid = torch.zeros((n, tp + tr), dtype=torch.bool, device=dev)
        for b, r in enumerate(rows):
            m = len(r.rest)
            ids[b, tr - m :] = torch.tensor(r.rest, device=dev)
            pos[b, tr - m :] = torch.arange(r.past_len, r.past_len + m, device=dev)
            valid[b, tp - r.past_len : tp] = True
            valid[b, tp + tr - m :] = True
        cache = DynamicCache(ddp_cache_data=_stack_past(rows, tp, self.model, dev)) if tp else DynamicCache()
        self.stats.prefill_tokens += sum(len(r.rest) for r in rows)
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            attention_mask=_attention_mask(valid, tr),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=tr if targets is not None else 1,
        )
        kvs: list[KV | None] = []
        for b, r in enumerate(rows):
            if not keep_kv:
                kvs.append(None)
                continue
            m = len(r.rest)
            kvs.append(
                [
                    (
                        torch.cat([layer.keys[b : b + 1, :, tp - r.past_len : tp], layer.keys[b : b + 1, :, tp + tr - m :]], dim=2),
                        torch.cat(
                            [layer.values[b : b + 1, :, tp - r.past_len : tp], layer.values[b : b + 1, :, tp + tr - m :]], dim=2
                        ),
                    )
                    for layer in cache.layers
                ]
            )
        lps: list[list[float]] = [[] for _ in rows]
        if targets is not None:
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            for b, t in enumerate(targets):
                m = len(t)
                picked = logp[b, tr - m :].gather(-1, torch.tensor(t, device=dev)[:, None])[:, 0]
                lps[b] = picked.tolist()
        return kvs, lps

    # ---- decoding --------------------------------------------------------------------------

    def _generate(
        self,
        prompts: list[list[int]],
        rows: list[tuple[int, int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: list[int],
    ) -> list[Sample]:
        """Sample one turn for each (prompt index, sample index) row, all rows decoded together."""

        dev = self.device
        if self.prefix_reuse:
            pasts = self._encode_prompts(prompts, sorted({c for c, _ in rows}))
            past_rows = [_Row(pasts[c][0], pasts[c][1], []) for c, _ in rows]
        else:
            # Plain batched generation: every row encodes its whole prompt, K times per state.
            heads = [prompts[c][:-1] for c, _ in rows]
            kvs = self._forward_rows([_Row(None, 0, h) for h in heads], keep_kv=True)[0]
            past_rows = [_Row(kv, len(h), []) for kv, h in zip(kvs, heads)]
        n = len(rows)
        tp = max(r.past_len for r in past_rows)
        cache = _buffer_cache(_stack_past(past_rows, tp, self.model, dev), max_new_tokens)
        valid = torch.zeros((n, tp), dtype=torch.bool, device=dev)
        for b, r in enumerate(past_rows):
            valid[b, tp - r.past_len :] = True
        pos = torch.tensor([[r.past_len] for r in past_rows], dtype=torch.long, device=dev)
        tokens = torch.tensor([[prompts[c][-1]] for c, _ in rows], dtype=torch.long, device=dev)
        keys = [_row_key(seeds[c], prompts[c], i) for c, i in rows]
        active = list(range(n))  # original row of each batch position
        gen: list[list[int]] = [[] for _ in rows]
        lps: list[list[float]] = [[] for _ in rows]
        finish: list[str] = ["length"] * n
        eos = torch.tensor(self.eos_ids, device=dev)
        for step in range(max_new_tokens):
            valid = torch.cat([valid, torch.ones((len(active), 1), dtype=torch.bool, device=dev)], dim=1)
            out = self.model(
                input_ids=tokens,
                position_ids=pos,
                attention_mask=_attention_mask(valid, 1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            draws = torch.tensor([_uniform(keys[r], step) for r in active], device=dev)
            choice = _choose(logits, temperature, top_p, draws)
            picked = logp.gather(-1, choice[:, None])[:, 0]
            self.stats.generated_tokens += len(active)
            done = torch.isin(choice, eos)
            keep = []
            for b, (r, tok, lp, d) in enumerate(zip(active, choice.tolist(), picked.tolist(), done.tolist())):
                gen[r].append(tok)
                lps[r].append(lp)
                if d:
                    finish[r] = "stop"
                elif self.stop_strings and self._hit_stop(gen[r]):
                    finish[r] = "stop_string"
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=dev)
                for layer in cache.layers:
                    layer.batch_select_indices(index)
                valid, choice, pos = valid[index], choice[index], pos[index]
                active = [active[b] for b in keep]
            tokens = choice[:, None]
            pos = pos + 1
        return [self._finish(g, lp, f) for g, lp, f in zip(gen, lps, finish)]

    def _hit_stop(self, ids: list[int]) -> bool:
        tail = self.tokenizer.decode(ids[-8:], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)

    def _finish(self, ids: list[int], lps: list[float], reason: str) -> Sample:
        if reason == "stop_string":
            text, _ = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=False), self.stop_strings)
            # Keep the tokens whose text lies wholly before the stop string.
            keep = 0
            while keep < len(ids) and len(self.tokenizer.decode(ids[: keep + 1], skip_special_tokens=False)) <= len(text):
                keep += 1
            ids, lps = ids[:keep], lps[:keep]
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        else:
            body = ids[:-1] if reason == "stop" else ids
            text = self.tokenizer.decode(body, skip_special_tokens=False)
        return Sample(text, tuple(ids), tuple(lps), float(sum(lps)), len(ids), reason)  # type: ignore[arg-type]


def _end_of_turn_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn; the first is the one chat templates write."""
    ids: list[int] = []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for tid in (im_end, tokenizer.eos_token_id, model.generation_config.eos_token_id):
        for t in tid if isinstance(tid, list) else [tid]:
            if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id and t not in ids:
                ids.append(t)
    if not ids:
        raise ValueError("tokenizer has no end-of-turn token (<|im_end|> or eos); cannot stop generation")
    return ids


def _stack_past(rows: Sequence[_Row], tp: int, model: Any, dev: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' cached keys/values left-padded to `tp`: `[rows, kv_heads, tp, head_dim]`."""
    template = next(r.past for r in rows if r.past is not None)
    layers = []
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(rows), k0.shape[1], tp, k0.shape[3]))
        values = v0.new_zeros((len(rows), v0.shape[1], tp, v0.shape[3]))
        for b, r in enumerate(rows):
            if r.past_len:
                k, v = r.past[layer]  # type: ignore[index]
                keys[b, :, tp - r.past_len :] = k[0, :, : r.past_len]
                values[b, :, tp - r.past_len :] = v[0, :, : r.past_len]
        layers.append((keys, values))
    return layers


def _attention_mask(valid: torch.Tensor, q_len: int) -> torch.Tensor:
    """4-D boolean mask `[rows, 1, q_len, kv_len]` from `valid` `[rows, kv_len]` (the last q_len
    positions are the queries): a query sees valid keys up to itself. A padding query also sees
    itself, so no row of the softmax is empty (an empty row gives NaN)."""
    n, kv_len = valid.shape
    q_idx = torch.arange(kv_len - q_len, kv_len, device=valid.device)[:, None]
    k_idx = torch.arange(kv_len, device=valid.device)[None, :]
    causal = k_idx <= q_idx
    mask = valid[:, None, :] & causal[None]
    mask |= (k_idx == q_idx)[None]
    return mask[:, None]


def _row_key(seed: int, prompt: list[int], index: int) -> bytes:
    digest = hashlib.sha256(np.asarray(prompt, dtype=np.int64).tobytes()).digest()
    return f"{seed}:{index}:".encode() + digest


def _uniform(key: bytes, step: int) -> float:
    """A uniform draw in [0, 1) determined by (row key, step)."""
    h = hashlib.blake2b(key + step.to_bytes(4, "little"), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / float(1 << 53)


def _choose(logits: torch.Tensor, temperature: float, top_p: float, draws: torch.Tensor) -> torch.Tensor:
    """Next token per row `[rows]`: greedy at temperature 0, else inverse-CDF sampling with the
    given uniform draws `[rows]` from softmax(logits / temperature) truncated to top-p."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1).double()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.cumsum(-1)
    target = (draws.double() * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, target, right=True)[:, 0]
    return index.clamp(max=logits.shape[-1] - 1)
