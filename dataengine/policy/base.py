"""The policy interface: sample K candidate actions per state, and score given continuations.

A state is a `Conversation` (the message list plus the tools shown to the model). A backend
renders it with the tokenizer's chat template (dataengine.chat_template), samples the assistant
turn and stops at the end of the turn (`<|im_end|>` / eos) or at a hallucinated
`<tool_response>` (the model writing the tool's answer itself).

Log-probs are under the model's own distribution (temperature 1, no top-p), the same numbers
`score` returns, so a sample's log-prob can serve as the behaviour / reference log-prob in DPO.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dataengine.types import Message, Task, ToolSpec

# Text the model must not write in its own turn; generation is cut where it starts.
STOP_STRINGS = ("<tool_response>",)

FinishReason = Literal["stop", "stop_string", "length"]


@dataclass(frozen=True)
class Conversation:
    """One state to act in: the messages so far and the tools the model may call."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()

    def __init__(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()):
        object.__setattr__(self, "messages", tuple(messages))
        object.__setattr__(self, "tools", tuple(tools))
        if not self.messages:
            raise ValueError("Conversation needs at least one message")

    @classmethod
    def from_task(cls, task: Task) -> Conversation:
        return cls(task.messages, task.tools)

    def chat(self) -> list[dict[str, Any]]:
        """Messages in the dict form chat templates read."""
        return [m.to_chat() for m in self.messages]

    def openai_tools(self) -> list[dict[str, Any]] | None:
        return [t.to_openai() for t in self.tools] or None

    def extend(self, *messages: Message) -> Conversation:
        """The conversation with `messages` appended (the tools stay)."""
        return Conversation(self.messages + tuple(messages), self.tools)


@dataclass(frozen=True)
class Sample:
    """One sampled (or scored) assistant turn.

    text: the turn's text, without the end-of-turn token and cut before any stop string.
    token_ids: `[num_tokens]` the generated token ids, including the end-of-turn token when the
        turn ended with one (finish_reason "stop").
    logprobs: `[num_tokens]` log-prob of each token under the model (temperature 1).
    logprob: sum of `logprobs`.
    num_tokens: len(token_ids).
    finish_reason: "stop" (end-of-turn token), "stop_string" (cut at a stop string) or
        "length" (hit max_new_tokens).
    dropped_tokens: tokens sampled past a stop string and cut from the turn; they were generated,
        so budgets count them (`generated_tokens`).
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    logprob: float
    num_tokens: int
    finish_reason: FinishReason
    dropped_tokens: int = 0

    @property
    def generated_tokens(self) -> int:
        """Tokens the policy generated for this turn: the kept ones plus any cut at a stop string."""
        return self.num_tokens + self.dropped_tokens

    @property
    def mean_logprob(self) -> float:
        """Length-normalised log-prob (what priors are made from)."""
        return self.logprob / max(1, self.num_tokens)


@dataclass(frozen=True)
class SampleRequest:
    """The arguments of one `sample` call, to decode beside others (`Policy.sample_together`):
    k samples of each of `convs` at `temperature` and `top_p`, with `seed` (one, or one per
    conversation) after the forced `prefix`."""

    convs: Sequence[Conversation]
    k: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | Sequence[int] = 0
    prefix: str = ""


@dataclass
class PolicyStats:
    """Counters for budget accounting and benchmarks; they only grow (see `reset`).

    prefill_tokens: prompt tokens run through the model (cache hits are not counted).
    cached_tokens: prompt tokens whose keys/values came from the prefix cache instead.
    generated_tokens: sampled tokens (every row, every step until it stopped).
    scored_tokens: continuation tokens run through the model by `score`.
    """

    calls: int = 0
    sequences: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    scored_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        for name in ("calls", "sequences", "prefill_tokens", "cached_tokens", "generated_tokens", "scored_tokens"):
            setattr(self, name, 0)
        self.seconds = 0.0
        self.extra.clear()

    def as_dict(self) -> dict[str, float]:
        out = {
            name: getattr(self, name)
            for name in ("calls", "sequences", "prefill_tokens", "cached_tokens", "generated_tokens", "scored_tokens", "seconds")
        }
        out.update(self.extra)
        return out


class Policy(ABC):
    """A sampler of assistant turns. Subclasses: HFPolicy (transformers), VLLMPolicy (vLLM)."""

    model_id: str
    stats: PolicyStats

    @abstractmethod
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
        """K samples for each conversation: `[len(convs)][k]`. Same seed and inputs, same samples.

        seed: one for the whole call, or one per conversation (`conv_seeds`).
        prefix: text every sample must start with (e.g. the tool-call opening tag); the model
            continues after it. The samples' text, token ids and log-probs include the prefix
            (its log-probs are the model's, from `score`; see `join_prefix`).
        """

    def sample_together(self, requests: Sequence[SampleRequest], *, max_new_tokens: int = 128) -> list[list[list[Sample]]]:
        """The samples of several `sample` calls, `[len(requests)][len(r.convs)][r.k]`: each
        request's are those `sample` returns for it alone. A backend that decodes the requests
        together (hf: one decode loop, so a step's cost is paid once for all their rows)
        overrides this; the default calls `sample` once per request."""
        return [
            self.sample(r.convs, r.k, max_new_tokens=max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                        seed=r.seed, prefix=r.prefix)
            for r in requests
        ]

    @abstractmethod
    def score(self, convs: Sequence[Conversation], continuations: Sequence[str], *, end_turn: bool = True) -> list[Sample]:
        """Log-probs of `continuations[i]` as the assistant turn after `convs[i]`.

        end_turn: also score the end-of-turn token (the probability that the turn ends there).
        """

    def render(self, conv: Conversation) -> str:
        """The prompt text the model sees for `conv` (ends with the assistant header)."""
        return self.tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            conv.chat(), tools=conv.openai_tools(), tokenize=False, add_generation_prompt=True
        )


def cut_at_stop(text: str, stops: Sequence[str] = STOP_STRINGS) -> tuple[str, bool]:
    """`text` cut before the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def finish_sample(tokenizer: Any, ids: Sequence[int], lps: Sequence[float], reason: str, stops: Sequence[str]) -> Sample:
    """A Sample from the token ids and log-probs a backend sampled, ended by `reason`.

    "stop": the last id is the end-of-turn token (kept in token_ids, not in the text).
    "stop_string": the ids run up to and including the token that completed a stop string (as
    vLLM returns them); only the tokens whose text lies wholly before the stop string are kept,
    the rest count as `dropped_tokens`. Both backends end turns through here, so their samples
    agree token for token."""
    ids, lps = list(ids), list(lps)
    sampled = len(ids)
    if reason == "stop_string":
        text, _ = cut_at_stop(tokenizer.decode(ids, skip_special_tokens=False), stops)
        keep = 0
        while keep < len(ids) and len(tokenizer.decode(ids[: keep + 1], skip_special_tokens=False)) <= len(text):
            keep += 1
        ids, lps = ids[:keep], lps[:keep]
        text = tokenizer.decode(ids, skip_special_tokens=False)
    else:
        text = tokenizer.decode(ids[:-1] if reason == "stop" else ids, skip_special_tokens=False)
    return Sample(text, tuple(ids), tuple(lps), float(sum(lps)), len(ids), reason, sampled - len(ids))  # type: ignore[arg-type]


def score_prefix(policy: Policy, convs: Sequence[Conversation], prefix: str) -> list[Sample] | None:
    """The forced `prefix` of a `sample` call scored after each conversation (its token ids and
    the model's log-probs of them), or None without a prefix."""
    return policy.score(convs, [prefix] * len(convs), end_turn=False) if prefix else None


def with_prefix(prompts: list[list[int]], forced: list[Sample] | None) -> list[list[int]]:
    """Prompt token ids with each conversation's forced prefix appended (generation continues it)."""
    return prompts if forced is None else [p + list(f.token_ids) for p, f in zip(prompts, forced)]


def join_prefix(rows: list[list[Sample]], forced: list[Sample] | None) -> list[list[Sample]]:
    """Samples generated after each conversation's forced prefix as whole turns starting with
    it. The prefix tokens count as generated (`num_tokens`), so budgets charge for them."""
    if forced is None:
        return rows
    return [
        [
            Sample(
                f.text + s.text,
                f.token_ids + s.token_ids,
                f.logprobs + s.logprobs,
                f.logprob + s.logprob,
                f.num_tokens + s.num_tokens,
                s.finish_reason,
                s.dropped_tokens,
            )
            for s in row
        ]
        for row, f in zip(rows, forced)
    ]


def conv_seeds(seed: int | Sequence[int], n: int) -> list[int]:
    """The seed of each of `n` conversations: `seed` for all of them, or one given per conversation."""
    if isinstance(seed, int):
        return [seed] * n
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"sample got {len(seeds)} seeds for {n} conversations")
    return seeds


def check_sampling_args(k: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1 samples per state, got {k}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class Timer:
    """Adds the wall time of a `with` block to `stats.seconds`."""

    def __init__(self, stats: PolicyStats):
        self.stats = stats

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stats.seconds += time.perf_counter() - self.start
