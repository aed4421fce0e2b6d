"""The `hf` policy backend: transformers causal LMs, batched, with shared-prefix decoding.

A hand-written decode loop over `model(...)`, because `model.generate` encodes every prompt
once per sample and decodes each sample over its own copy of the prompt's keys/values. Here
(attention and key/value layout in `dataengine.policy.kv`):

1. Each distinct prompt is encoded once, in blocks of CACHE_BLOCK tokens; blocks go into
   `PrefixCache`, keyed by all tokens up to the block's end, so a later prompt reuses every block
   it shares with an earlier one (the system prompt and tools across trees, a parent's prompt
   for its children).
2. The K samples of a prompt are decoded together over one copy of its keys/values (a group);
   each sample keeps only the keys/values of its own generated tokens. Rows that end are
   dropped from the batch in steps of ROW_MULTIPLE rows.
3. Sampling is seeded per row: the uniform draw for token t of sample i of a prompt is a hash
   of (seed, prompt tokens, i, t) (the seed of the call, or of that conversation when one per
   conversation is given), turned into a token by inverse-CDF sampling.

Outputs are bit-identical whatever other conversations share the call, whatever earlier calls
left in the cache, and with or without the cache (see `kv` for why).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dataengine.policy.base import (
    STOP_STRINGS,
    Conversation,
    Policy,
    PolicyStats,
    Sample,
    SampleRequest,
    Timer,
    check_sampling_args,
    conv_seeds,
    finish_sample,
    join_prefix,
    score_prefix,
    with_prefix,
)
from dataengine.policy.kv import (
    ATTN_BLOCK,
    CACHE_BLOCK,
    ROW_MULTIPLE,
    SUFFIX_BLOCK,
    Attend,
    PrefixCache,
    block_keys,
    blocked_attention_on,
    check_supported,
    round_up,
)

MAX_SLOTS = 16  # samples of one prompt per group (more samples make more groups)
SCORE_SLOTS = 8  # scored continuations of one prompt per group
WORKSPACE_BYTES = 512 << 20  # buffers up to this size are kept between calls


class HFPolicy(Policy):
    """Policy over a transformers causal LM and its tokenizer (with a tool-aware chat template).

    prefix_reuse: keep encoded prompt blocks in the LRU across calls (False encodes each
        distinct prompt of a call from scratch; the outputs are the same, bit for bit).
    cache_tokens: size of the prefix LRU in token positions.
    max_batch_tokens: bound on rows x tokens of one `score` forward (4 x that for its logits).
    max_batch_rows: most sequences decoded together (bounds the key/value memory).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        prefix_reuse: bool = True,
        cache_tokens: int = 16384,
        max_batch_tokens: int = 4096,
        max_batch_rows: int = 64,
        stop_strings: Sequence[str] = STOP_STRINGS,
    ):
        from dataengine.models import model_id

        check_supported(model)
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.prefix_reuse = prefix_reuse
        self.cache = PrefixCache(cache_tokens)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_rows = max_batch_rows
        self.stop_strings = tuple(stop_strings)
        self.model_id = model_id(model)
        self.stats = PolicyStats()
        self.eos_ids = _end_of_turn_ids(model, tokenizer)
        self.end_turn_id = self.eos_ids[0]
        config = model.config
        self.layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.group_heads = config.num_attention_heads // self.kv_heads  # query heads per kv head
        head = model.get_output_embeddings()
        plain = isinstance(head, torch.nn.Linear) and head.bias is None
        self.head_weight = head.weight if plain else None
        self._buffers: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()  # calls share the cache and the buffers: one at a time

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
        tools: Sequence[str] = (),
        **options: Any,
    ) -> HFPolicy:
        """Load `model` ("smollm2", "tiny" or a folder) on `device` ("auto" picks cuda when present).

        fewshot, system, listing, tools: the prompt options (`chat_template.install_prompt_options`).
        """
        from dataengine.chat_template import install_prompt_options
        from dataengine.models import load_model

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        lm, tokenizer = load_model(model, device=device, dtype=dtype)
        install_prompt_options(tokenizer, fewshot=fewshot, system=system, listing=listing, tools=tools)
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

    def sample(
        self,
        convs: Sequence[Conversation],
        k: int,
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] = 0,
        prefix: str = "",
    ) -> list[list[Sample]]:
        request = SampleRequest(convs, k, temperature=temperature, top_p=top_p, seed=seed, prefix=prefix)
        return self._sample_requests([request], max_new_tokens)[0]

    def sample_together(self, requests: Sequence[SampleRequest], *, max_new_tokens: int = 128) -> list[list[list[Sample]]]:
        """All requests' rows in one decode loop (batches of at most max_batch_rows rows); each
        row keeps its own request's temperature, top-p, seed and sample index, so the samples are
        bit-identical to one `sample` call per request."""
        return self._sample_requests(requests, max_new_tokens)

    @torch.inference_mode()
    def _sample_requests(self, requests: Sequence[SampleRequest], max_new_tokens: int) -> list[list[list[Sample]]]:
        for r in requests:
            check_sampling_args(r.k, max_new_tokens, r.temperature, r.top_p)
        live = [r for r in requests if r.convs]
        if not live:
            return [[] for _ in requests]
        # Prefixes are scored first (their log-probs), then continued from.
        forced = [score_prefix(self, r.convs, r.prefix) for r in live]
        with self._lock, Timer(self.stats), self._switched():
            self.stats.calls += 1
            # One flat prompt per (request, conversation), with its seed and sampling settings.
            prompts: list[list[int]] = []
            seeds: list[int] = []
            sampling: list[tuple[float, float]] = []
            owner: list[tuple[int, int, int]] = []  # flat prompt -> (request, conversation, k)
            for q, (r, f) in enumerate(zip(live, forced)):
                prompts += with_prefix([self.encode(c) for c in r.convs], f)
                seeds += conv_seeds(r.seed, len(r.convs))
                sampling += [(r.temperature, r.top_p)] * len(r.convs)
                owner += [(q, c, r.k) for c in range(len(r.convs))]
            out: list[list[list[Sample]]] = [[[] for _ in r.convs] for r in live]
            # Groups: (flat prompt, sample indices), at most `slots` samples each, whole groups
            # per decode batch.
            # At least 4 query rows per decode product (see kv): slots * query heads per kv head
            # >= 4, so a row's numbers are the same whatever slot count the call's requests need.
            slots = max([-(-4 // self.group_heads)] + [min(r.k, MAX_SLOTS) for r in live])
            groups = [(p, list(range(s, min(k, s + slots)))) for p, (_, _, k) in enumerate(owner) for s in range(0, k, slots)]
            limit = max(self.max_batch_rows, slots)
            batch: list[tuple[int, list[int]]] = []
            for group in groups + [None]:  # type: ignore[list-item]
                if group is not None and sum(len(g[1]) for g in batch) + len(group[1]) <= limit:
                    batch.append(group)
                    continue
                if batch:
                    samples = self._generate(prompts, batch, slots, max_new_tokens, sampling, seeds)
                    for (p, _), s in zip([(p, i) for p, idx in batch for i in idx], samples):
                        q, c, _ = owner[p]
                        out[q][c].append(s)
                batch = [group] if group is not None else []
            self.stats.sequences += sum(len(r.convs) * r.k for r in live)
        joined = iter([join_prefix(o, f) for o, f in zip(out, forced)])
        return [next(joined) if r.convs else [] for r in requests]

    @torch.inference_mode()
    def score(self, convs: Sequence[Conversation], continuations: Sequence[str], *, end_turn: bool = True) -> list[Sample]:
        if len(convs) != len(continuations):
            raise ValueError(f"score needs one continuation per conversation: {len(convs)} != {len(continuations)}")
        if not convs:
            return []
        with self._lock, Timer(self.stats), self._switched():
            self.stats.calls += 1
            prompts = [self.encode(c) for c in convs]
            targets = []
            for text in continuations:
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                targets.append(ids + [self.end_turn_id] if end_turn else ids)
            if any(not t for t in targets):
                raise ValueError("cannot score an empty continuation with end_turn=False")
            logprobs: list[list[float]] = []
            budget = max(1, self.max_batch_tokens // 4)
            chunk: list[int] = []
            for i in list(range(len(prompts))) + [None]:  # type: ignore[list-item]
                if i is not None:
                    width = max(2, max(len(targets[j]) for j in chunk + [i]))
                    rows = round_up(len(chunk) + 1, ROW_MULTIPLE)
                    if not chunk or (rows <= self.max_batch_rows and rows * width <= budget):
                        chunk.append(i)
                        continue
                if chunk:
                    logprobs += self._score_chunk([prompts[j] for j in chunk], [targets[j] for j in chunk])
                chunk = [i] if i is not None else []
            self.stats.scored_tokens += sum(len(t) for t in targets)
            result = []
            for text, t, lp in zip(continuations, targets, logprobs):
                result.append(Sample(text, tuple(t), tuple(lp), float(sum(lp)), len(t), "stop" if end_turn else "length"))
        return result

    # ---- forwards --------------------------------------------------------------------------

    def _switched(self) -> Any:
        """The model's forwards with `blocked_attention` (and, on CPU, weight-first linear layers)."""
        return blocked_attention_on(self.model, weight_first=self.device.type == "cpu")

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Final hidden states `[rows, T, hidden]` of `ids` `[rows, T]` at positions `pos`."""
        out = self.model.base_model(input_ids=ids, position_ids=pos, use_cache=False, attend=attend)
        return out.last_hidden_state

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[m, vocab]` (float32) of hidden states `[m, hidden]`. The product always has at
        least 12 rows, a multiple of 4 (batch-invariant, see kv), and runs as weight @ hidden^T,
        which MKL streams faster than hidden @ weight^T for the vocabulary matrix."""
        m = hidden.shape[0]
        rows = max(12, round_up(m, ROW_MULTIPLE))
        if rows > m:
            hidden = torch.cat([hidden, hidden.new_zeros((rows - m, hidden.shape[1]))])
        if self.head_weight is not None:
            return torch.matmul(self.head_weight, hidden.T).T[:m].float()
        return self.model.get_output_embeddings()(hidden)[:m].float()

    def _work(self, name: str, *shape: int) -> torch.Tensor:
        """A buffer of `shape` kept between calls (contents undefined): on CPU every fresh large
        allocation page-faults its memory in again."""
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=self.dtype, device=self.device)
            if numel * buf.element_size() <= WORKSPACE_BYTES:
                self._buffers[name] = buf
        return buf[:numel].view(shape)

    def _fill_heads(
        self, heads: Sequence[Sequence[int]], logits: bool = False
    ) -> tuple[torch.Tensor, list[int], int, torch.Tensor | None]:
        """Keys/values of each prompt head as one group: `[layers, 2, len(heads), kv_heads,
        nb * ATTN_BLOCK, head_dim]`, zeros past each head's end; the head lengths; the shared
        length (`Attend.shared`: whole ATTN_BLOCKs where all heads have the same tokens); and with
        `logits`, the logits after each head `[len(heads), vocab]` (float32).

        Cached blocks are copied in; the rest is encoded in waves, one forward per wave for all
        heads (see `_encode`), each head up to the end of its ATTN_BLOCK chunk per wave. A head
        whose next block another head of the wave is computing waits a wave and takes it from the
        cache."""
        lengths = [len(h) for h in heads]
        shared = _common_prefix(heads, min(lengths))
        shared -= shared % ATTN_BLOCK
        width = round_up(max(lengths), ATTN_BLOCK)
        prefix = self._work("prefix", self.layers, 2, len(heads), self.kv_heads, width, self.head_dim)
        # Without prefix_reuse blocks are still shared within the call.
        cache = self.cache if self.prefix_reuse else PrefixCache(sum(lengths))
        first: dict[tuple[int, ...], int] = {}
        todo: list[_Head] = []
        for g, head in enumerate(heads):
            if tuple(head) not in first:
                first[tuple(head)] = g
                todo.append(_Head(g, head))
        after: dict[int, torch.Tensor] = {}
        while todo:
            wave, waiting = [], set()
            for h in todo:
                self._take_cached(h, prefix, cache)
                if h.done == len(h.ids) and logits:
                    last = cache.logits(h.keys[-1][2])
                    if last is not None:
                        after[h.slot] = last
                    else:
                        # Keys/values all cached but not the logits: the last position again (same numbers).
                        h.done -= 1
                        self.stats.cached_tokens -= 1
                if h.done == len(h.ids):
                    continue
                block = h.keys[h.done // CACHE_BLOCK][2]
                if block not in waiting:
                    waiting.add(block)
                    wave.append(h)
            if wave:
                for h, last in zip(wave, self._encode(wave, prefix, logits)):
                    if last is not None:
                        after[h.slot] = last
                    self._put_computed(h, prefix, cache, logits, after.get(h.slot))
            todo = [h for h in todo if h.done < len(h.ids) or (logits and h.slot not in after)]
        for g, head in enumerate(heads):
            source = first[tuple(head)]
            if source != g:
                prefix[:, :, g] = prefix[:, :, source]
            prefix[:, :, g, :, len(head) :] = 0
        return prefix, lengths, shared, torch.stack([after[first[tuple(h)]] for h in heads]) if logits else None

    def _take_cached(self, h: _Head, prefix: torch.Tensor, cache: PrefixCache) -> None:
        """Copy the cached blocks that continue head `h` into its slot and move `h.done` on."""
        while h.hits < len(h.keys) and h.done == h.keys[h.hits][0]:
            start, end, digest = h.keys[h.hits]
            kv = cache.get(digest)
            if kv is None:
                length, kv = cache.partial(h.before, h.ids[start:])
                if kv is not None and length > h.done - start:
                    prefix[:, :, h.slot, :, start : start + length] = kv
                    self.stats.cached_tokens += start + length - h.done
                    h.done = start + length
                return
            prefix[:, :, h.slot, :, start:end] = kv
            self.stats.cached_tokens += end - start
            h.done, h.hits, h.before = end, h.hits + 1, digest

    def _put_computed(self, h: _Head, prefix: torch.Tensor, cache: PrefixCache, logits: bool, last: torch.Tensor | None) -> None:
        """Store the blocks of head `h` computed up to `h.done`, and the logits after the head."""
        while h.hits < len(h.keys) and h.keys[h.hits][1] <= h.done:
            start, end, digest = h.keys[h.hits]
            cache.put(digest, prefix[:, :, h.slot, :, start:end].clone(), h.before, h.ids[start:end])
            h.hits, h.before = h.hits + 1, digest
        if logits and last is not None and h.done == len(h.ids):
            cache.set_logits(h.keys[-1][2], last)

    def _encode(self, wave: list[_Head], prefix: torch.Tensor, logits: bool) -> list[torch.Tensor | None]:
        """One forward for the heads of `wave`: each head's tokens from `done` to the end of its
        ATTN_BLOCK chunk (or of the head), written into its slot of `prefix`; `done` moves on.
        Returns, per head, the logits after the head's last token when this wave reached it and
        `logits` is asked, else None.

        A position is computed the same way whatever was cached before and whatever other heads
        share the wave: the chunks before its own chunk are prefix keys (ATTN_BLOCKs), its chunk's
        earlier positions are suffix keys (SUFFIX_BLOCKs from the chunk start)."""
        n = len(wave)
        chunk = [h.done - h.done % ATTN_BLOCK for h in wave]
        ends = [min(len(h.ids), c + ATTN_BLOCK) for h, c in zip(wave, chunk)]
        off = [h.done - c for h, c in zip(wave, chunk)]
        t = round_up(max(e - h.done for h, e in zip(wave, ends)), ROW_MULTIPLE)  # padding after real tokens
        suffix = self._work("block", self.layers, 2, n, self.kv_heads, round_up(max(off) + t, SUFFIX_BLOCK), self.head_dim)
        suffix.zero_()
        width = max(chunk)
        for i, (h, c) in enumerate(zip(wave, chunk)):
            suffix[:, :, i, :, : off[i]] = prefix[:, :, h.slot, :, c : h.done]
            prefix[:, :, h.slot, :, c:width] = 0  # this head's padding keys: masked, but must be finite
        attend = Attend(suffix, off)
        if width:
            shared = _common_prefix([h.ids for h in wave], min(chunk))
            lengths = [width] * prefix.shape[2]
            for h, c in zip(wave, chunk):
                lengths[h.slot] = c
            attend.shared_from = wave[0].slot
            attend.set_prefix(prefix[:, :, :, :, :width], lengths, [h.slot for h in wave], shared - shared % ATTN_BLOCK)
        begin = [h.done for h in wave]
        ids = torch.full((n, t), self.end_turn_id, dtype=torch.long, device=self.device)
        for i, (h, e) in enumerate(zip(wave, ends)):
            ids[i, : e - begin[i]] = torch.tensor(h.ids[begin[i] : e], device=self.device)
        pos = torch.tensor(begin, device=self.device)[:, None] + torch.arange(t, device=self.device)
        hidden = self._forward(ids, pos, attend)
        for i, (h, c, e) in enumerate(zip(wave, chunk, ends)):
            prefix[:, :, h.slot, :, c:e] = suffix[:, :, i, :, : e - c]
            self.stats.prefill_tokens += e - begin[i]
            h.done = e
        out: list[torch.Tensor | None] = [None] * n
        last = [i for i, h in enumerate(wave) if logits and h.done == len(h.ids)]
        if last:
            index = torch.tensor([ends[i] - begin[i] - 1 for i in last], device=self.device)
            rows = self._logits(hidden[torch.tensor(last, device=self.device), index])
            for i, row in zip(last, rows):
                out[i] = row.clone()
        return out

    def _score_chunk(self, prompts: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Log-prob of each target token after its prompt, in one forward; rows with the same
        prompt share its keys/values (SCORE_SLOTS rows per group)."""
        heads: list[list[int]] = []
        scatter: list[int] = []
        open_group: dict[tuple[int, ...], tuple[int, int]] = {}
        for p in prompts:
            g, used = open_group.get(tuple(p[:-1]), (-1, SCORE_SLOTS))
            if used == SCORE_SLOTS:
                g, used = len(heads), 0
                heads.append(p[:-1])
            scatter.append(g * SCORE_SLOTS + used)
            open_group[tuple(p[:-1])] = (g, used + 1)
        n = len(prompts)
        rows = round_up(n, ROW_MULTIPLE)
        # At least 4 query rows per suffix product (see kv): t * query heads per kv head >= 4.
        t = max(max(len(x) for x in targets), -(-4 // self.group_heads))
        prefix, lengths, shared, _ = self._fill_heads(heads)
        suffix = self._work("suffix", self.layers, 2, rows, self.kv_heads, round_up(t, SUFFIX_BLOCK), self.head_dim).zero_()
        attend = Attend(suffix, 0, prefix, lengths, SCORE_SLOTS, scatter + [len(heads) * SCORE_SLOTS] * (rows - n), shared)
        ids = torch.full((rows, t), self.end_turn_id, dtype=torch.long, device=self.device)
        pos = torch.zeros((rows, t), dtype=torch.long, device=self.device)
        for b, (p, x) in enumerate(zip(prompts, targets)):
            ids[b, : len(x)] = torch.tensor([p[-1]] + x[:-1], device=self.device)
            pos[b] = torch.arange(len(p) - 1, len(p) - 1 + t, device=self.device)
        hidden = self._forward(ids, pos, attend)
        logp = torch.log_softmax(self._logits(hidden.reshape(rows * t, -1)).view(rows, t, -1), dim=-1)
        return [
            logp[b, : len(x)].gather(-1, torch.tensor(x, device=self.device)[:, None])[:, 0].tolist()
            for b, x in enumerate(targets)
        ]

    # ---- decoding --------------------------------------------------------------------------

    def _generate(
        self,
        prompts: list[list[int]],
        groups: list[tuple[int, list[int]]],
        slots: int,
        max_new_tokens: int,
        sampling: list[tuple[float, float]],
        seeds: list[int],
    ) -> list[Sample]:
        """Sample one turn for each (prompt, sample index) of `groups`, all decoded together, at
        each prompt's (temperature, top_p) of `sampling`. Returns the samples in group order."""
        dev = self.device
        rows = [(c, i) for c, idx in groups for i in idx]
        group_of = [g for g, (_, idx) in enumerate(groups) for _ in idx]
        slot_of = [i % slots for _, idx in groups for i in idx]
        n = len(rows)
        width = round_up(n, ROW_MULTIPLE)
        # Whole prompts: the first token is sampled from the logits of the prompt's encoding.
        prefix, lengths, shared, first = self._fill_heads([prompts[c] for c, _ in groups], logits=True)
        cap = round_up(max(1, max_new_tokens - 1), SUFFIX_BLOCK)
        suffix = self._work("suffix", self.layers, 2, width, self.kv_heads, cap, self.head_dim).zero_()
        live_groups = list(range(len(groups)))  # group held in each prefix slot
        scatter = [g * slots + s for g, s in zip(group_of, slot_of)] + [len(groups) * slots] * (width - n)
        attend = Attend(suffix, 0, prefix, lengths, slots, scatter, shared)
        pos = torch.tensor([len(prompts[c]) for c, _ in rows] + [0] * (width - n), device=dev)
        tokens = torch.zeros(width, dtype=torch.long, device=dev)  # input of the next forward
        draws = torch.tensor(
            [[_uniform(_row_key(seeds[c], prompts[c], i), t) for t in range(max_new_tokens)] for c, i in rows]
            + [[0.5] * max_new_tokens] * (width - n),
            dtype=torch.float64,
            device=dev,
        )
        batch = list(range(width))  # row at each batch position (>= n: padding)
        gen: list[list[int]] = [[] for _ in rows]
        lps: list[list[float]] = [[] for _ in rows]
        finish: list[str | None] = [None] * n
        eos = torch.tensor(self.eos_ids, device=dev)
        for step in range(max_new_tokens):
            if step == 0:
                logits = first.index_select(0, torch.tensor(group_of + [0] * (width - n), device=dev))  # type: ignore[union-attr]
            else:
                attend.start = step - 1
                logits = self._logits(self._forward(tokens[:, None], pos[:, None], attend)[:, -1])
                pos = pos + 1
            logp = torch.log_softmax(logits, dim=-1)
            choice = self._choose_rows(logits, batch, rows, sampling, draws[torch.tensor(batch, device=dev), step])
            picked = logp.gather(-1, choice[:, None])[:, 0]
            done = torch.isin(choice, eos)
            live = 0
            for r, tok, lp, d in zip(batch, choice.tolist(), picked.tolist(), done.tolist()):
                if r >= n or finish[r] is not None:
                    continue
                gen[r].append(tok)
                lps[r].append(lp)
                self.stats.generated_tokens += 1
                if d:
                    finish[r] = "stop"
                elif self.stop_strings and self._hit_stop(gen[r]):
                    finish[r] = "stop_string"
                else:
                    live += 1
            if not live or step + 1 == max_new_tokens:
                break
            tokens = choice
            if round_up(live, ROW_MULTIPLE) < len(batch):
                # Drop ended rows, in place; ended rows kept as padding point at no group.
                keep = [b for b, r in enumerate(batch) if r < n and finish[r] is None]
                pad = [b for b, r in enumerate(batch) if r >= n or finish[r] is not None][: (-len(keep)) % ROW_MULTIPLE]
                index = torch.tensor(keep + pad, device=dev)
                used = suffix[:, :, :, :, :step].index_select(2, index)
                suffix = suffix[:, :, : len(index)]
                suffix[:, :, :, :, :step] = used
                attend.suffix = suffix
                tokens, pos = tokens[index], pos[index]
                batch = [batch[b] for b in keep + pad]
                alive = sorted({group_of[r] for r in batch[: len(keep)]})
                if len(alive) <= 3 * len(live_groups) // 4:
                    # Move the live groups' prefixes to the front (slots only move down).
                    where = {g: j for j, g in enumerate(live_groups)}
                    for j, g in enumerate(alive):
                        if where[g] != j:
                            prefix[:, :, j] = prefix[:, :, where[g]]
                    lengths = [lengths[where[g]] for g in alive]
                    prefix = prefix[:, :, : len(alive), :, : round_up(max(lengths), ATTN_BLOCK)]
                    live_groups = alive
                    attend.set_prefix(prefix, lengths, [], shared)
                where = {g: j for j, g in enumerate(live_groups)}
                attend.set_rows(
                    [where[group_of[r]] * slots + slot_of[r] for r in batch[: len(keep)]]
                    + [len(live_groups) * slots] * len(pad)
                )
        return [finish_sample(self.tokenizer, g, lp, f or "length", self.stop_strings) for g, lp, f in zip(gen, lps, finish)]

    @staticmethod
    def _choose_rows(
        logits: torch.Tensor,
        batch: list[int],
        rows: list[tuple[int, int]],
        sampling: list[tuple[float, float]],
        draws: torch.Tensor,
    ) -> torch.Tensor:
        """`_choose` for each batch position at its prompt's (temperature, top_p): one call per
        distinct setting, each with the scalar settings a lone `sample` call would use (a row's
        numbers do not depend on the other rows of a call)."""
        setting = [sampling[rows[r][0]] if r < len(rows) else None for r in batch]
        distinct = sorted({x for x in setting if x is not None})
        if len(distinct) == 1:
            return _choose(logits, *distinct[0], draws)
        choice = torch.zeros(len(batch), dtype=torch.long, device=logits.device)
        for temperature, top_p in distinct:
            # Padding rows (None) ride with the first setting; their tokens are ignored.
            at = [b for b, x in enumerate(setting) if x == (temperature, top_p) or (x is None and (temperature, top_p) == distinct[0])]
            index = torch.tensor(at, device=logits.device)
            choice[index] = _choose(logits.index_select(0, index), temperature, top_p, draws.index_select(0, index))
        return choice

    def _hit_stop(self, ids: list[int]) -> bool:
        tail = self.tokenizer.decode(ids[-8:], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)


class _Head:
    """A prompt head being filled: its slot, token ids, cache block keys, the positions done,
    the blocks taken from or put into the cache (`hits`) and the digest ending them (`before`)."""

    def __init__(self, slot: int, ids: Sequence[int]):
        self.slot, self.ids = slot, list(ids)
        self.keys = block_keys(self.ids)
        self.done, self.hits, self.before = 0, 0, b""


def _common_prefix(heads: Sequence[Sequence[int]], limit: int) -> int:
    """Length of the common token prefix of `heads`, at most `limit`."""
    first = np.asarray(heads[0][:limit], dtype=np.int64)
    n = len(first)
    for h in heads[1:]:
        diff = np.flatnonzero(np.asarray(h[:n], dtype=np.int64) != first[:n])
        n = int(diff[0]) if diff.size else min(n, len(h))
    return n


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
    probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1).double()
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
