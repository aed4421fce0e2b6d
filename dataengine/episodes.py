"""One episode runner for every loop of the engine that plays whole episodes.

`run_episodes(env, starts, source, ...)` plays one episode per start state (an `EnvState`; the
same state may start several episodes). The assistant text of each turn comes from `source`:
a `Sampler` (a Policy with temperature / top_p / max_new_tokens and a base seed) or a `Script`
(given turns per episode). Every step, all live episodes take ONE `policy.sample` call (one
row each, each row with its own seed) and ONE `ToolEnv.step_many`. Users: Monte Carlo rollouts
(`values.RolloutValue`), best-of-N and greedy baselines (`search.baselines.play_episodes`),
evaluation episodes (`evaluation.rollout.rollouts`) and scripted replays
(`gold_demo.run_turns`, the rescore flow).

Seeds. The turn at step `step` (0 = the first turn played from the start state) of episode
`number` is sampled with `episode_seed(base_seed, start.prefix_hash, number, step)`, and with
the hf backend the row's randomness is a hash of that seed and the prompt. So an episode is a
function of (base seed, start state, episode number) alone: not of the other episodes in the
batch, their order, or the wave it was launched in. Episodes with different numbers from one
start are independent samples; one number from one start state twice is the same episode.

Truncation (the one rule; `EpisodeRun.end` says which applied):
- "answer": the turn was a final answer (state.done).
- "env_limit": the env's own step limit (`ToolEnv.max_steps`, counted from the task's first
  turn) truncated the episode (state.truncated, set by the env).
- "max_steps": `max_steps` turns were played from the start state without an answer.
- "budget": the episode's `TokenBudget` key was exhausted before its next turn. Tokens are
  charged after each sampling call, so the turn that crosses the limit is still played: a key
  overshoots by at most one turn of each of its live episodes.
- "script": a `Script` ran out of turns for the episode.
An episode that ends by "max_steps", "budget" or "script" is returned with state.truncated =
True (unfinished; the verifiers score it as it is). A turn cut at the policy's max_new_tokens
(Sample.finish_reason "length") is NOT an end: it is parsed as written, and a cut or malformed
tool call becomes the parser's error observation (a tool message), after which the episode
goes on like any other turn.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dataengine.budget import TokenBudget
from dataengine.env import EnvState, ToolEnv
from dataengine.policy.base import Conversation, Policy, Sample

End = Literal["answer", "env_limit", "max_steps", "budget", "script"]
# Ends after which the runner marks the state truncated (the env did not end the episode).
CUT: tuple[End, ...] = ("max_steps", "budget", "script")


def episode_seed(base_seed: int, start: str, number: int, step: int) -> int:
    """The sampling seed of turn `step` of episode `number` from the start state whose
    `prefix_hash` is `start`: a hash of the four, in [0, 2**31 - 1)."""
    key = f"{base_seed}:{start}:{number}:{step}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % (2**31 - 1)


@dataclass(frozen=True)
class Sampler:
    """Assistant turns sampled from `policy` (temperature 0 is greedy); `seed` is the base seed
    of `episode_seed`."""

    policy: Policy
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0


@dataclass(frozen=True)
class Script:
    """Assistant turns given in advance: `turns[i]` are the texts of episode i, in order."""

    turns: Sequence[Sequence[str]]


@dataclass
class EpisodeRun:
    """One played episode.

    index: its position in the `starts` given to `run_episodes`; number: its episode number.
    start: the state it started from; state: its last state (terminal on return).
    samples: one Sample per sampled turn (token ids, per-token log-probs); empty for a Script.
    end: why it ended (see the module docstring); None while it runs.
    """

    index: int
    number: int
    start: EnvState
    state: EnvState
    samples: list[Sample] = field(default_factory=list)
    end: End | None = None

    @property
    def tokens(self) -> int:
        """Generated tokens over the episode."""
        return sum(s.generated_tokens for s in self.samples)

    @property
    def logprob(self) -> float:
        """Summed behaviour log-prob of every sampled turn."""
        return sum(s.logprob for s in self.samples)

    @property
    def turns(self) -> int:
        """Turns played from the start state."""
        return self.state.num_steps - self.start.num_steps


def run_episodes(
    env: ToolEnv,
    starts: Sequence[EnvState],
    source: Sampler | Script,
    *,
    numbers: Sequence[int] | None = None,
    max_steps: int | None = None,
    budget: TokenBudget | None = None,
    budget_keys: Sequence[int] | None = None,
    on_step: Callable[[list[EpisodeRun]], None] | None = None,
) -> list[EpisodeRun]:
    """Play one episode from each start state until every one has ended; `[len(starts)]` runs in
    the order of `starts`.

    numbers: the episode number of each (default 0 for all): it picks the seed stream.
    max_steps: turns per episode from its start (None: only the env's step limit ends it).
    budget, budget_keys: generated tokens of episode i are charged to `budget_keys[i]` (may be
        left out when the budget has a single key).
    on_step: called after every step with all runs (finished and live).
    """
    starts = list(starts)
    n = len(starts)
    numbers = [0] * n if numbers is None else list(numbers)
    if len(numbers) != n:
        raise ValueError(f"run_episodes got {len(numbers)} episode numbers for {n} start states")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
    if isinstance(source, Script) and len(source.turns) != n:
        raise ValueError(f"Script has {len(source.turns)} turn lists for {n} start states")
    keys: list[int] = []
    if budget is not None:
        if budget_keys is None and len(budget.used) != 1:
            raise ValueError(f"budget_keys are needed for a budget of {len(budget.used)} keys")
        keys = [0] * n if budget_keys is None else list(budget_keys)
        if len(keys) != n:
            raise ValueError(f"run_episodes got {len(keys)} budget keys for {n} start states")
    runs = [EpisodeRun(i, numbers[i], s, s) for i, s in enumerate(starts)]
    step = 0
    while True:
        live = [r for r in runs if r.end is None and not _ended(r, step, source, max_steps, budget, keys)]
        if not live:
            break
        texts = _texts(live, step, source, budget, keys)
        outcomes = env.step_many([r.state for r in live], texts)
        for r, out in zip(live, outcomes):
            r.state = out.state
        step += 1
        if on_step is not None:
            on_step(runs)
    for r in runs:
        if r.end in CUT and not r.state.terminal:
            r.state = dataclasses.replace(r.state, truncated=True)
    return runs


def _ended(run: EpisodeRun, step: int, source: Sampler | Script, max_steps: int | None,
           budget: TokenBudget | None, keys: list[int]) -> bool:
    """Set `run.end` when the episode cannot play turn `step`; True when it ended."""
    if run.state.done:
        run.end = "answer"
    elif run.state.truncated:
        run.end = "env_limit"
    elif max_steps is not None and step >= max_steps:
        run.end = "max_steps"
    elif budget is not None and budget.exhausted(keys[run.index]):
        run.end = "budget"
    elif isinstance(source, Script) and step >= len(source.turns[run.index]):
        run.end = "script"
    return run.end is not None


def _texts(live: list[EpisodeRun], step: int, source: Sampler | Script, budget: TokenBudget | None,
           keys: list[int]) -> list[str]:
    """The assistant text of turn `step` of each live episode (one policy call for a Sampler)."""
    if isinstance(source, Script):
        return [source.turns[r.index][step] for r in live]
    out = source.policy.sample(
        [Conversation(r.state.messages, r.state.task.tools) for r in live],
        1,
        max_new_tokens=source.max_new_tokens,
        temperature=source.temperature,
        top_p=source.top_p,
        seed=[episode_seed(source.seed, r.start.prefix_hash, r.number, step) for r in live],
    )
    texts = []
    for r, row in zip(live, out):
        r.samples.append(row[0])
        texts.append(row[0].text)
        if budget is not None:
            budget.charge(keys[r.index], row[0].generated_tokens)
    return texts
