"""Value estimators for search leaves.

- `RolloutValue`: Monte Carlo rollouts with the policy (`dataengine.episodes.run_episodes`),
  batched over states and rollouts, to the end of the episode (or a step / token budget); the
  value is the mean episode reward.
- `AICritic`: Agent Q's critic. The model sees the state and the K candidate actions labelled
  A, B, C, ... and the probability it gives to each label as the answer ranks them; rank ->
  score in [0, 1]. Optional `debias` also scores the reversed order (small models prefer "A").
- `ValueModel`: a ridge-regression head on the frozen policy model's last hidden state, fitted
  on Q targets (for instance the `nodes` table's `q` column with `messages_json`).
- `mix_q`: Q = a * Q_mcts + (1 - a) * Q_critic (SearchConfig.critic_mix is `a`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataengine.episodes import Sampler, run_episodes
from dataengine.policy.base import Conversation, Policy
from dataengine.types import Episode, Message, ToolSpec

LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def mix_q(q_mcts: float, q_critic: float, a: float) -> float:
    """Agent Q's mixed value a * Q_mcts + (1 - a) * Q_critic; a in [0, 1] (1 ignores the critic)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"mix weight a must be in [0, 1], got {a}")
    return a * q_mcts + (1.0 - a) * q_critic


@dataclass(frozen=True)
class ValueEstimate:
    """A leaf value: `value` (mean reward), how many rollouts it averages, and what was seen.

    details: rewards (per rollout), unfinished (rollouts cut by the step or token budget).
    """

    value: float
    n: int
    details: dict[str, Any] = field(default_factory=dict)


class RolloutValue:
    """Monte Carlo value: play each state out with the policy and average the episode rewards.

    env: a dataengine.env.ToolEnv; reward: Episode -> float (e.g.
        `lambda ep: CompositeReward().score(ep).reward`).
    rollouts: episodes per state (episode numbers 0..rollouts-1 of `dataengine.episodes`);
    max_steps: assistant turns per rollout at most; max_generated_tokens: budget per `estimate`
        call. Rollouts cut by either are scored as they are (flagged `unfinished`); the
        truncation rule and the seeds are those of `dataengine.episodes.run_episodes`.
    All live rollouts of all states take one policy call per step.
    """

    def __init__(
        self,
        policy: Policy,
        env: Any,
        reward: Callable[[Episode], float],
        *,
        rollouts: int = 4,
        max_steps: int = 4,
        max_new_tokens: int = 96,
        temperature: float = 1.0,
        max_generated_tokens: int = 20000,
        seed: int = 0,
    ):
        if rollouts < 1 or max_steps < 1:
            raise ValueError(f"rollouts and max_steps must be >= 1, got {rollouts} and {max_steps}")
        self.policy, self.env, self.reward = policy, env, reward
        self.rollouts, self.max_steps = rollouts, max_steps
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.max_generated_tokens, self.seed = max_generated_tokens, seed

    def estimate(self, states: Sequence[Any]) -> list[ValueEstimate]:
        """One estimate per EnvState (a terminal state is scored directly, no rollout)."""
        from dataengine.search.budget import (
            TokenBudget,  # not at the top: dataengine.search imports this module
        )

        open_ = [i for i, s in enumerate(states) if not s.terminal]
        runs = run_episodes(
            self.env,
            [states[i] for i in open_ for _ in range(self.rollouts)],
            Sampler(self.policy, self.temperature, max_new_tokens=self.max_new_tokens, seed=self.seed),
            numbers=[r for _ in open_ for r in range(self.rollouts)],
            max_steps=self.max_steps,
            budget=TokenBudget.for_tasks(1, self.max_generated_tokens),
        )
        mine = {i: runs[j * self.rollouts : (j + 1) * self.rollouts] for j, i in enumerate(open_)}
        result = []
        for i, state in enumerate(states):
            if state.terminal:
                result.append(ValueEstimate(float(self.reward(state.episode())), 0, {"terminal": True}))
                continue
            rewards = [float(self.reward(r.state.episode())) for r in mine[i]]
            unfinished = sum(r.end in ("max_steps", "budget") for r in mine[i])
            result.append(
                ValueEstimate(sum(rewards) / len(rewards), len(rewards), {"rewards": rewards, "unfinished": unfinished})
            )
        return result


CRITIC_SYSTEM = (
    "You are a careful critic of an assistant that uses tools. You are shown a task, the "
    "conversation so far, and candidate next replies labelled with letters. Answer with the "
    "letter of the best candidate only."
)


@dataclass(frozen=True)
class CriticScores:
    """Critic output for one state: `scores[k]` in [0, 1] for candidate k (1 = ranked first),
    `probs[k]` the normalised label probability, and `fallback` when the model put almost no
    mass on the labels and the scores are uniform (0.5)."""

    scores: list[float]
    probs: list[float]
    fallback: bool
    label_mass: float


class AICritic:
    """Agent Q's AI critic: rank the K candidate actions of a state with the model itself.

    policy: any Policy (its `score` reads the label probabilities).
    debias: also score the candidates in reversed order and average (position bias).
    min_label_mass: below this total probability on the labels, fall back to uniform scores.
    """

    def __init__(self, policy: Policy, *, debias: bool = True, min_label_mass: float = 1e-3, system: str = CRITIC_SYSTEM):
        self.policy, self.debias, self.min_label_mass, self.system = policy, debias, min_label_mass, system

    def prompt(self, state: Conversation, candidates: Sequence[str]) -> Conversation:
        """The critic's own conversation for ranking `candidates` after `state`."""
        if not 1 <= len(candidates) <= len(LABELS):
            raise ValueError(f"the critic ranks 1..{len(LABELS)} candidates, got {len(candidates)}")
        history = "\n".join(f"[{m.role}] {m.content or _calls_text(m)}" for m in state.messages)
        tools = ", ".join(t.name for t in state.tools) or "none"
        listing = "\n".join(f"{LABELS[i]}) {c.strip()}" for i, c in enumerate(candidates))
        user = (
            f"Tools: {tools}\n\nConversation so far:\n{history}\n\nCandidate next replies:\n{listing}\n\n"
            f"Which candidate is the best next reply? Answer with one letter ({', '.join(LABELS[: len(candidates)])})."
        )
        return Conversation([Message(role="system", content=self.system), Message(role="user", content=user)])

    def rank(self, states: Sequence[Conversation], candidates: Sequence[Sequence[str]]) -> list[CriticScores]:
        """Scores for each state's candidates; all label log-probs in one batched score call."""
        if len(states) != len(candidates):
            raise ValueError(f"rank needs one candidate list per state: {len(states)} != {len(candidates)}")
        orders = [[list(range(len(c)))] + ([list(reversed(range(len(c))))] if self.debias and len(c) > 1 else []) for c in candidates]
        convs, conts, where = [], [], []
        for s, (state, cands) in enumerate(zip(states, candidates)):
            for o, order in enumerate(orders[s]):
                conv = self.prompt(state, [cands[j] for j in order])
                for pos in range(len(cands)):
                    convs.append(conv)
                    conts.append(LABELS[pos])
                    where.append((s, o, order[pos]))
        scored = self.policy.score(convs, conts, end_turn=False) if convs else []
        probs = [[[0.0] * len(c) for _ in orders[s]] for s, c in enumerate(candidates)]
        for (s, o, j), sample in zip(where, scored):
            probs[s][o][j] = float(torch.tensor(sample.logprob).exp())
        out = []
        for s, cands in enumerate(candidates):
            mass = sum(sum(p) for p in probs[s]) / len(probs[s])
            if mass < self.min_label_mass:
                out.append(CriticScores([0.5] * len(cands), [1.0 / len(cands)] * len(cands), True, mass))
                continue
            # Average the normalised distributions of the orderings, then rank.
            avg = [sum(p[j] / sum(p) for p in probs[s]) / len(probs[s]) for j in range(len(cands))]
            out.append(CriticScores(rank_scores(avg), avg, False, mass))
        return out


def rank_scores(values: Sequence[float]) -> list[float]:
    """Rank -> score in [0, 1]: the best gets 1, the worst 0, evenly spaced; ties share the mean."""
    n = len(values)
    if n == 1:
        return [1.0]
    order = sorted(range(n), key=lambda j: -values[j])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2
        i = j + 1
    return [1.0 - r / (n - 1) for r in ranks]


def _calls_text(message: Message) -> str:
    return " ".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls)


class ValueModel:
    """A value head on the frozen policy model: ridge regression from the last prompt token's
    final hidden state `[hidden]` to Q. Fitted in closed form (deterministic, seconds on CPU).

    model, tokenizer: the causal LM (its hidden states are the features) and its tokenizer.
    l2: ridge penalty. Predictions are clipped to the range of the training targets.
    """

    def __init__(self, model: Any, tokenizer: Any, *, l2: float = 1.0, batch_size: int = 16):
        self.model, self.tokenizer, self.l2, self.batch_size = model, tokenizer, l2, batch_size
        self.weight: torch.Tensor | None = None  # [hidden + 1] (last entry is the bias)
        self.low, self.high = 0.0, 1.0

    @torch.no_grad()
    def features(self, states: Sequence[Conversation]) -> torch.Tensor:
        """`[len(states), hidden]` final-layer hidden state at the last prompt token."""
        rows = []
        device = next(self.model.parameters()).device
        for start in range(0, len(states), self.batch_size):
            batch = states[start : start + self.batch_size]
            ids = [
                list(self.tokenizer.apply_chat_template(c.chat(), tools=c.openai_tools(), add_generation_prompt=True, tokenize=True, return_dict=False))
                for c in batch
            ]
            width = max(len(i) for i in ids)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=device)
            mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=device)
            out = self.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            rows.append(out.hidden_states[-1][:, -1].float().cpu())
        return torch.cat(rows)

    def fit(self, states: Sequence[Conversation], targets: Sequence[float]) -> dict[str, float]:
        """Fit on (state, Q) pairs; returns the training mean squared error and count."""
        if len(states) != len(targets) or not states:
            raise ValueError(f"fit needs as many targets as states (and at least one): {len(states)} vs {len(targets)}")
        x = self.features(states).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        y = torch.tensor(list(targets), dtype=torch.float64)
        eye = torch.eye(x.shape[1], dtype=x.dtype)
        eye[-1, -1] = 0.0  # the bias is not penalised
        self.weight = torch.linalg.solve(x.T @ x + self.l2 * eye, x.T @ y)
        self.low, self.high = float(y.min()), float(y.max())
        mse = float(((x @ self.weight).clamp(self.low, self.high) - y).pow(2).mean())
        return {"mse": mse, "n": float(len(y))}

    def predict(self, states: Sequence[Conversation]) -> list[float]:
        if self.weight is None:
            raise RuntimeError("ValueModel is not fitted: call fit() or load() first")
        x = self.features(states).double()
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        return (x @ self.weight).clamp(self.low, self.high).tolist()

    def save(self, path: str | Path) -> None:
        if self.weight is None:
            raise RuntimeError("nothing to save: the ValueModel is not fitted")
        from dataengine.models import model_id

        torch.save({"weight": self.weight, "low": self.low, "high": self.high, "l2": self.l2, "model_id": model_id(self.model)}, path)

    def load(self, path: str | Path) -> ValueModel:
        from dataengine.models import model_id

        saved = torch.load(path, weights_only=True)
        if saved["model_id"] != model_id(self.model):
            raise ValueError(f"value head {path} was fitted on {saved['model_id']}, not on {model_id(self.model)}")
        self.weight, self.low, self.high, self.l2 = saved["weight"], saved["low"], saved["high"], saved["l2"]
        return self


def q_targets_from_nodes(rows: Iterable[dict[str, Any]], tools: Sequence[ToolSpec] = ()) -> tuple[list[Conversation], list[float]]:
    """(states, Q) from `nodes` table rows (dicts with `messages_json` and `q`, e.g.
    `store.scan("nodes").select("messages_json", "q").collect().to_dicts()`); rows without Q
    are skipped. The state is the conversation after the node's action and observations."""
    states, targets = [], []
    for row in rows:
        if row.get("q") is None or not row.get("messages_json"):
            continue
        messages = [Message.model_validate(m) for m in json.loads(row["messages_json"])]
        states.append(Conversation(messages, tools))
        targets.append(float(row["q"]))
    return states, targets
