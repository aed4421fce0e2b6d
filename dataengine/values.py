"""Value estimators for search leaves.

- `RolloutValue`: Monte Carlo rollouts with the policy (`dataengine.episodes.run_episodes`),
  batched over states and rollouts, to the end of the episode (or a step / token budget); the
  value is the mean episode reward.
- `AICritic`: Agent Q's critic. The model sees the state and the K candidate actions labelled
  A, B, C, ... and the probability it gives to each label as the answer ranks them; rank ->
  score in [0, 1]. Optional `debias` also scores the reversed order (small models prefer "A").
- `ValueModel`: a ridge-regression head on the frozen policy model's last hidden state, fitted
  on the backed-up values of searched nodes (`store_q_targets`, `fit_value_head`; the command is
  `dataengine train value`). It renders states with the policy's own `encode` at fit and use,
  and refuses a policy whose model or tokenizer differs from the one it was fitted over.
- `reference_progress`: oracle-assisted, for labelled training tasks only: how far the episode
  so far follows the task's reference calls, in order (the same call check as the arguments
  verifier). It reads the gold, so it never serves held-out evaluation.
- `mix_q`: Q = a * Q_mcts + (1 - a) * Q_critic (SearchConfig.critic_mix is `a`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataengine.budget import TokenBudget
from dataengine.episodes import Sampler, run_episodes
from dataengine.policy.base import Conversation, Policy
from dataengine.types import Episode, Message, Task

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


def reference_progress(task: Task, calls: Sequence[Any]) -> float:
    """matched / (number of reference calls + 1): the leading calls that equal the task's
    reference calls one by one (BFCL's call check, `verifiers.arguments.check_call`), counted
    until the first that does not; the + 1 is the final answer still to come, so only a verified
    success reaches 1. A call beyond the reference, or a task without reference calls, adds
    nothing (0 for the latter)."""
    from dataengine.verifiers.arguments import check_call, gold_acceptable

    gold = gold_acceptable(task)
    if not gold:
        return 0.0
    schemas = {t.name: t.parameters for t in task.tools}
    matched = 0
    for call, (name, acceptable) in zip(calls, gold):
        if not check_call(schemas.get(name, {"properties": {}, "required": []}), call, name, acceptable).valid:
            break
        matched += 1
    return matched / (len(gold) + 1)


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
    """A value head on a frozen hf policy: ridge regression from the final hidden state (after
    the last norm) at the last prompt token, `[hidden]`, to the state's value. Fitted in closed
    form (deterministic, seconds on CPU once the features are computed).

    policy: an hf-backend policy (`HFPolicy`): its model gives the features and its own
        `encode` renders each state, so the head reads exactly the prompt tokens the policy
        samples from (same chat template, same tools listing) at fit and at use.
    l2: ridge penalty (the bias is not penalised). Predictions are clipped to the range of
        the training targets.
    max_batch_tokens: padded tokens per forward pass of the feature extraction.
    """

    def __init__(self, policy: Policy, *, l2: float = 1.0, max_batch_tokens: int = 8192):
        if not hasattr(policy, "model") or not hasattr(policy, "encode"):
            raise TypeError(f"a value head needs an hf-backend policy (its model's hidden states); got {type(policy).__name__}")
        if l2 < 0 or max_batch_tokens < 1:
            raise ValueError(f"l2 must be >= 0 and max_batch_tokens >= 1, got {l2} and {max_batch_tokens}")
        self.policy, self.l2, self.max_batch_tokens = policy, l2, max_batch_tokens
        self.model, self.tokenizer = policy.model, policy.tokenizer  # type: ignore[attr-defined]
        self.weight: torch.Tensor | None = None  # [hidden + 1] (last entry is the bias)
        self.low, self.high = 0.0, 1.0
        self.info: dict[str, Any] = {}

    def encode(self, state: Conversation) -> list[int]:
        """The prompt token ids of `state`: the policy's own rendering (its `encode`)."""
        return list(self.policy.encode(state))  # type: ignore[attr-defined]

    def render(self, state: Conversation) -> str:
        """The text the head reads for `state` (the decoded `encode`)."""
        return self.tokenizer.decode(self.encode(state))

    @torch.no_grad()
    def features(self, states: Sequence[Conversation]) -> torch.Tensor:
        """`[len(states), hidden]` final hidden state at the last prompt token.

        States are sorted by length and packed into batches of at most `max_batch_tokens`
        padded tokens, right-padded: a causal model's real tokens never see the padding, so
        a state's features do not depend on the batch it lands in.
        """
        ids = [self.encode(s) for s in states]
        body = self.model.base_model  # the decoder without the LM head: no [T, vocab] logits
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = torch.zeros(len(ids), self.model.config.hidden_size)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        start = 0
        while start < len(order):
            width = len(ids[order[start]])
            rows = max(1, self.max_batch_tokens // max(1, width))
            batch = order[start : start + rows]
            start += len(batch)
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for r, i in enumerate(batch):
                input_ids[r, : len(ids[i])] = torch.tensor(ids[i])
                mask[r, : len(ids[i])] = 1
            hidden = body(input_ids=input_ids.to(device), attention_mask=mask.to(device)).last_hidden_state
            last = torch.tensor([len(ids[i]) - 1 for i in batch], device=device)
            out[batch] = hidden[torch.arange(len(batch), device=device), last].float().cpu()
        return out

    def fit(self, states: Sequence[Conversation], targets: Sequence[float], groups: Sequence[str] | None = None,
            folds: int = 5) -> dict[str, float]:
        """Fit on (state, value) pairs. Returns n, the training mean squared error `mse` and
        `baseline_mse` (predicting the mean target) to compare it with.

        groups: one key per state (its task): also returns `cv_mse` and `cv_baseline_mse`, the
        errors on states of tasks held out of the fit (`folds` folds by task; the baseline
        predicts the other folds' mean), which say whether the head generalises to new tasks
        (a head of hidden-size weights fits a few hundred training states almost exactly).
        """
        if len(states) != len(targets) or not states:
            raise ValueError(f"fit needs as many targets as states (and at least one): {len(states)} vs {len(targets)}")
        if groups is not None and len(groups) != len(states):
            raise ValueError(f"fit needs one group per state: {len(groups)} groups for {len(states)} states")
        x = _with_bias(self.features(states))
        y = torch.tensor(list(targets), dtype=torch.float64)
        self.weight, self.low, self.high = self._solve(x, y), float(y.min()), float(y.max())
        mse = float(((x @ self.weight).clamp(self.low, self.high) - y).pow(2).mean())
        out = {"n": float(len(y)), "mse": mse, "baseline_mse": float((y - y.mean()).pow(2).mean())}
        keys = sorted(set(groups or ()))
        if len(keys) >= 2:
            fold_of = {key: i % min(folds, len(keys)) for i, key in enumerate(keys)}
            fold = torch.tensor([fold_of[g] for g in groups])
            err, base = torch.zeros_like(y), torch.zeros_like(y)
            for f in fold.unique().tolist():
                held, kept = fold == f, fold != f
                w = self._solve(x[kept], y[kept])
                pred = (x[held] @ w).clamp(float(y[kept].min()), float(y[kept].max()))
                err[held], base[held] = (pred - y[held]).pow(2), (y[kept].mean() - y[held]).pow(2)
            out.update(cv_mse=float(err.mean()), cv_baseline_mse=float(base.mean()), cv_folds=float(len(fold.unique())))
        return out

    def _solve(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Ridge weights for features `x` (bias column last, not penalised) and targets `y`."""
        eye = torch.eye(x.shape[1], dtype=x.dtype)
        eye[-1, -1] = 0.0
        return torch.linalg.solve(x.T @ x + self.l2 * eye, x.T @ y)

    def predict(self, states: Sequence[Conversation]) -> list[float]:
        """`[len(states)]` values, clipped to the training targets' range."""
        if self.weight is None:
            raise RuntimeError("ValueModel is not fitted: call fit() or load() first")
        if not states:
            return []
        return (_with_bias(self.features(states)) @ self.weight).clamp(self.low, self.high).tolist()

    def identity(self) -> dict[str, str]:
        """What the head is tied to: the policy's model id and its tokenizer's identity."""
        return {"model_id": self.policy.model_id, "tokenizer_id": tokenizer_id(self.tokenizer)}

    def save(self, path: str | Path, info: dict[str, Any] | None = None) -> None:
        """Write the head with `identity()` and `info` (JSON-able facts: runs, counts, errors)."""
        if self.weight is None:
            raise RuntimeError("nothing to save: the ValueModel is not fitted")
        self.info = dict(info or {})
        torch.save({"weight": self.weight, "low": self.low, "high": self.high, "l2": self.l2,
                    "info_json": json.dumps(self.info, sort_keys=True), **self.identity()}, path)

    def load(self, path: str | Path) -> ValueModel:
        """Read a head written by `save`; refused (ValueError naming both sides) when it was
        fitted over another model or another tokenizer / chat template."""
        if not Path(path).is_file():
            raise ValueError(f"value head {path} is not a file (fit one with `dataengine train value`)")
        try:
            saved = torch.load(path, weights_only=True)
            weight, low, high, l2 = saved["weight"], saved["low"], saved["high"], saved["l2"]
        except Exception as exc:  # a foreign or damaged file
            raise ValueError(f"value head {path} is not a ValueModel head: {exc}".splitlines()[0]) from None
        mine = self.identity()
        theirs = {k: saved.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(
                f"value head {path} was fitted over model {theirs['model_id']} with tokenizer {theirs['tokenizer_id']}, "
                f"not over this policy's model {mine['model_id']} with tokenizer {mine['tokenizer_id']}; "
                "refit it with `dataengine train value`"
            )
        self.weight, self.low, self.high, self.l2 = weight, float(low), float(high), float(l2)
        self.info = json.loads(saved.get("info_json") or "{}")
        return self


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    """`[n, hidden]` -> `[n, hidden + 1]` float64 with a column of ones."""
    x = x.double()
    return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)


def tokenizer_id(tokenizer: Any) -> str:
    """16 hex chars naming how a tokenizer turns a state into ids: its vocabulary (token -> id,
    added tokens included), special tokens and chat template (which holds the prompt options)."""
    from dataengine.types import stable_hash

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return stable_hash({
        "vocab": vocab,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "chat_template": getattr(tokenizer, "chat_template", None) or "",
    })


# ---------------------------------------------------------------------------- training data


def state_conversation(messages: Sequence[Message], task: Task) -> Conversation:
    """The state the search values: its messages and the task's tools (as the search shows them)."""
    return Conversation(messages, task.tools)


def q_targets_from_nodes(
    rows: Iterable[dict[str, Any]], tasks: Iterable[dict[str, Any]], *, min_visits: int = 1
) -> tuple[list[Conversation], list[float]]:
    """(states, values) to fit a head on, from `nodes` and `tasks` table rows.

    rows: dicts with run_id, task_id, messages_json, q, reward, terminal and visits (e.g.
        `store.nodes().collect().to_dicts()`); tasks: dicts with run_id, task_id, task_json.
    Each state is the node's conversation with its task's tools (`state_conversation`, what the
    search renders). The target is the node's backed-up value V = q - reward (q is
    Q(parent, action) = reward + V; the root's q is its V). Skipped: terminal nodes (the search
    never asks for their value), nodes with fewer than `min_visits` visits, rows without q.
    """
    known: dict[tuple[str, str], Task] = {}
    for t in tasks:
        known[(t["run_id"], t["task_id"])] = Task.model_validate_json(t["task_json"])
    states, targets = [], []
    for row in rows:
        if row.get("q") is None or not row.get("messages_json") or row.get("terminal"):
            continue
        if (row.get("visits") or 0) < min_visits:
            continue
        task = known.get((row.get("run_id"), row.get("task_id")))
        if task is None:
            raise ValueError(f"node {row.get('node_id')} of run {row.get('run_id')!r} names task {row.get('task_id')!r}, "
                             "which is not in the tasks rows")
        messages = [Message.model_validate(m) for m in json.loads(row["messages_json"])]
        states.append(state_conversation(messages, task))
        targets.append(float(row["q"]) - float(row.get("reward") or 0.0))
    return states, targets


def store_q_targets(store: Any, runs: Sequence[str], *, min_visits: int = 1) -> tuple[list[Conversation], list[float]]:
    """`q_targets_from_nodes` over the committed nodes and tasks of `runs` in a storage.Store."""
    import polars as pl

    if not runs:
        raise ValueError("name at least one run to fit a value head on")
    wanted = pl.col("run_id").is_in(list(runs))
    nodes = store.scan_or_empty("nodes").filter(wanted).select(
        "run_id", "task_id", "node_id", "messages_json", "q", "reward", "terminal", "visits").collect()
    missing = sorted(set(runs) - set(nodes["run_id"].to_list()))
    if missing:
        have = sorted(set(store.scan_or_empty("nodes").select("run_id").collect()["run_id"].to_list()))
        raise ValueError(f"run(s) {', '.join(missing)} have no search nodes in store {store.root} (runs with nodes: {', '.join(have) or 'none'})")
    tasks = store.scan_or_empty("tasks").filter(wanted).select("run_id", "task_id", "task_json").collect()
    return q_targets_from_nodes(nodes.to_dicts(), tasks.to_dicts(), min_visits=min_visits)


def run_policy_config(store: Any, runs: Sequence[str], model: str, device: str = "auto") -> Any:
    """The PolicyConfig to fit a head for `model`: the prompt settings (few_shot) the runs
    searched with, so the head reads the prompts the search rendered; hf backend, `device`."""
    import polars as pl

    from dataengine.config import PolicyConfig

    rows = store.scan_or_empty("runs").filter(pl.col("run_id").is_in(list(runs))).select("run_id", "config_json").collect()
    settings = {}
    for row in rows.to_dicts():
        policy = json.loads(row["config_json"] or "{}").get("engine", {}).get("policy")
        if policy is not None:
            settings[row["run_id"]] = policy.get("few_shot", True)
    if len(set(settings.values())) > 1:
        raise ValueError(f"the runs searched with different prompts (policy.few_shot {settings}); fit one head per prompt")
    few_shot = next(iter(settings.values()), True)
    return PolicyConfig(backend="hf", model=model, device=device, few_shot=few_shot)


def fit_value_head(store: Any, runs: Sequence[str], policy: Policy, out: str | Path, *, l2: float = 1.0,
                   min_visits: int = 2, max_batch_tokens: int = 8192) -> dict[str, Any]:
    """Fit a ValueModel over `policy` on the runs' visited nodes and save it to `out`.

    min_visits: 2 by default, so each target backs up at least one simulation below the node
    (a leaf visited once holds only the estimate the search gave it). Returns the summary
    saved with the head: runs, n, mse, baseline_mse, cv_mse, cv_baseline_mse (by task, see
    ValueModel.fit), min_visits, l2, model_id, tokenizer_id.
    """
    states, targets = store_q_targets(store, runs, min_visits=min_visits)
    if not states:
        raise ValueError(f"run(s) {', '.join(runs)} have no non-terminal node with >= {min_visits} visits to fit on")
    head = ValueModel(policy, l2=l2, max_batch_tokens=max_batch_tokens)
    # A state's task is its question (the first user message): the held-out error is by task.
    tasks = [next((m.content for m in s.messages if m.role == "user"), "") for s in states]
    info = {"runs": sorted(runs), "min_visits": min_visits, "l2": l2, **head.fit(states, targets, groups=tasks)}
    head.save(out, info)
    return {**info, **head.identity(), "out": str(out)}
