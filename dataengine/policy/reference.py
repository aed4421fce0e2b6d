"""The `hf` backend's samples reproduced by transformers' own `model.generate`: the peer that
its shared-prefix decoding is checked against.

`generate` decodes each conversation's K rows over K copies of the prompt (no padding: the
rows of one call share a prompt) in transformers' loop, and a LogitsProcessor applies the
backend's sampling rule at each step: the same per-row uniform draw (`hf._row_key`,
`hf._uniform`) turned into a token by the same inverse-CDF rule (`hf._choose`), every other
token masked out so greedy decoding picks it. The decoding (attention, keys/values, positions)
is transformers'; only the draw is shared, so equal tokens mean equal logits up to rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dataengine.policy.base import Conversation, conv_seeds
from dataengine.policy.hf import HFPolicy, _choose, _row_key, _uniform


@dataclass
class Reference:
    """One row's tokens from `generate`, up to and including the first end-of-turn token.

    token_ids: the generated ids; logprobs: log-softmax of the model's logits at each chosen
    token (the same length).
    """

    token_ids: list[int]
    logprobs: list[float]


class PolicyDraws:
    """A transformers LogitsProcessor choosing row r's token t as HFPolicy does.

    keys: the row keys `[rows]` (hf._row_key of seed, prompt tokens, sample index);
    prompt_length: the prompt's tokens (step t = current length - prompt_length).
    `logprobs[t]` holds each row's log-prob of the token chosen at step t.
    """

    def __init__(self, keys: list[bytes], prompt_length: int, temperature: float, top_p: float) -> None:
        self.keys, self.prompt_length = keys, prompt_length
        self.temperature, self.top_p = temperature, top_p
        self.logprobs: list[list[float]] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_length
        draws = torch.tensor([_uniform(k, step) for k in self.keys], dtype=torch.float64, device=scores.device)
        logits = scores.float()
        choice = _choose(logits, self.temperature, self.top_p, draws)
        self.logprobs.append(torch.log_softmax(logits, dim=-1).gather(-1, choice[:, None])[:, 0].tolist())
        return torch.full_like(scores, float("-inf")).scatter(-1, choice[:, None], 0.0)


@torch.inference_mode()
def generate_reference(
    policy: HFPolicy,
    convs: Sequence[Conversation],
    k: int,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | Sequence[int] = 0,
    model: torch.nn.Module | None = None,
) -> list[list[Reference]]:
    """`[len(convs)][k]` References: what `policy.sample(convs, k, ...)` draws, decoded by
    `model.generate` (default: the policy's model). Stop strings are not applied: a sample the
    policy cut at one is a prefix of its reference."""
    from transformers import GenerationConfig, LogitsProcessorList

    model = model if model is not None else policy.model
    seeds = conv_seeds(seed, len(convs))
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(policy.eos_ids),
                              pad_token_id=policy.eos_ids[0])
    out = []
    for c, conv in enumerate(convs):
        prompt = policy.encode(conv)
        draws = PolicyDraws([_row_key(seeds[c], prompt, i) for i in range(k)], len(prompt), temperature, top_p)
        ids = torch.tensor([prompt] * k, device=model.device)
        generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                   logits_processor=LogitsProcessorList([draws]))[:, len(prompt):].tolist()
        rows = []
        for i, tokens in enumerate(generated):
            end = next((t + 1 for t, tok in enumerate(tokens) if tok in policy.eos_ids), len(tokens))
            rows.append(Reference(tokens[:end], [draws.logprobs[t][i] for t in range(end)]))
        out.append(rows)
    return out
