"""Progressive widening, transpositions and the budget across trees of the LLM tree search,
their store columns, and their place in the generate run id.

`RulePolicy` is a test double of the model (the Policy interface of dataengine/policy/base.py):
sample i of a conversation is `reply(conversation, seed, i)`, so a test decides what the
"model" proposes at each state; the tiny random model runs the real sampling path.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence

import polars as pl
import pytest
import torch

from dataengine.config import EngineConfig, load_config
from dataengine.policy import Conversation, Policy, PolicyStats, Sample
from dataengine.policy.base import conv_seeds
from dataengine.policy.hf import HFPolicy
from dataengine.search import LLMExpander, TokenBudget, batch_rows, search_batch
from dataengine.search.nodes import transposition_key, widen_cap
from dataengine.stages import make_reward
from dataengine.stages.generate import default_run_id
from dataengine.suites import generate_suite

TOKENS = 4


def call(name: str, a: int, b: int) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


class RulePolicy(Policy):
    """Sample i of a conversation is `prefix + reply(conv, seed, i)` (TOKENS tokens, log-prob -1).

    asked: every (messages, k) it was asked to sample, in order; prefixes: the forced prefix of each.
    """

    def __init__(self, reply: Callable[..., str]):
        # reply(conv, seed, i) or, for rules that read a forced prefix, reply(conv, seed, i, prefix).
        self.reply = reply if reply.__code__.co_argcount == 4 else (lambda conv, seed, i, prefix: reply(conv, seed, i))
        self.model_id = "rules@0"
        self.stats = PolicyStats()
        self.asked: list[tuple[tuple, int]] = []
        self.prefixes: list[str] = []

    def sample(self, convs: Sequence[Conversation], k: int, *, seed=0, prefix="", **kwargs) -> list[list[Sample]]:
        self.stats.calls += 1
        out = []
        for conv, s in zip(convs, conv_seeds(seed, len(convs))):
            self.asked.append((conv.messages, k))
            self.prefixes.append(prefix)
            row = [
                Sample(prefix + self.reply(conv, s, i, prefix), tuple(range(TOKENS)), (-1.0 / TOKENS,) * TOKENS, -1.0, TOKENS, "stop")
                for i in range(k)
            ]
            self.stats.generated_tokens += TOKENS * k
            out.append(row)
        return out

    def score(self, convs, continuations, *, end_turn=True):
        raise NotImplementedError("the rule policy only samples")


def turn(conv: Conversation) -> int:
    return sum(m.role == "assistant" for m in conv.messages)


@pytest.fixture(scope="module")
def tasks():
    return generate_suite("arithmetic", n_train=3, n_heldout=0, seed=0)


def config(**overrides) -> EngineConfig:
    base = {
        "policy__model": "tiny",
        "policy__device": "cpu",
        "policy__max_new_tokens": 4,
        "search__num_simulations": 8,
        "search__num_actions": 2,
        "search__max_actions": 6,
        "search__value": "zero",
        "search__max_generated_tokens": 10_000,
        # The trees these tests check sample every candidate at temperature 1.
        "search__greedy_candidate": False,
        "policy__temperature": 1.0,
    }
    base.update(overrides)
    return load_config(None, **base)


def messages(row: dict) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in json.loads(row["messages_json"])]


def rows_by_tree(nodes: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in nodes:
        out.setdefault(r["tree_id"], {})[r["node_id"]] = r
    return out


# ---------------------------------------------------------------- progressive widening


def test_widening_adds_candidates_only_at_exhausted_nodes_within_the_cap(env, tiny, tasks):
    """The tiny model answers at once: every root candidate is a wrong final answer, so the
    root is exhausted as soon as each candidate has a child. Each widening round must find the
    node exhausted, stay within k(N) = ceil(c N^alpha) and the 6 slots, and wait for the cap
    to grow before the next round."""
    cfg = config(search__num_simulations=12)
    reward = make_reward(cfg, env)
    batch = search_batch(tasks[:2], policy=tiny, env=env, reward=reward, config=cfg, seed=0)
    nodes, _ = batch_rows(batch, tiny.model_id)
    rounds = 0
    for node in batch.table.nodes:
        caps = [0]
        for i, rd in enumerate(node.widen_rounds, 1):
            rounds += 1
            assert rd.round == i and rd.expanded == rd.edges_before  # exhausted when widened
            assert rd.cap == widen_cap(rd.visits, 2.0, 0.5, 6) == min(6, math.ceil(2.0 * math.sqrt(rd.visits)))
            assert rd.edges_before < rd.cap and rd.edges_after <= rd.cap and rd.cap > caps[-1]
            assert rd.samples == min(2, rd.cap - rd.edges_before)
            caps.append(rd.cap)
            assert sum(e.round == i for e in node.edges) == rd.edges_after - rd.edges_before
        assert len(node.edges) <= 6
    assert rounds > 0 and batch.counters.widen_rounds == rounds
    for b in range(2):
        root = batch.table[b]
        assert len(root.edges) > 2  # widened beyond the first K = 2 samples
        assert int((~torch.isneginf(batch.tree.children_prior_logits[b, 0])).sum()) == len(root.edges)
    # The rows say which feature produced each node.
    for r in nodes:
        if r["parent_id"] is None:
            assert r["origin"] == "root" and r["widen_round"] is None
        else:
            # the tiny model's replies hold no tool call, so some rounds are tool-call rounds
            assert r["origin"] in (("widen", "widen_tool") if r["widen_round"] > 0 else ("expand",))
    assert {"root", "expand"} < {r["origin"] for r in nodes} <= {"root", "expand", "widen", "widen_tool"}

    off = search_batch(tasks[:2], policy=tiny, env=env, reward=reward, config=config(search__num_simulations=12, search__widening=False), seed=0)
    assert all(not n.widen_rounds and len(n.edges) <= 2 for n in off.table.nodes)
    assert off.tree.num_actions == 2 and batch.tree.num_actions == 6
    rows, _ = batch_rows(off, tiny.model_id)
    assert {r["origin"] for r in rows} == {"root", "expand"}


def test_widening_charges_its_samples_to_the_tree(env, tasks):
    policy = RulePolicy(lambda conv, seed, i: str(1000 + (seed * 7 + i) % 997))
    # (plain rounds only: a forced tool-call round's broken calls would be expanded too)
    cfg = config(search__num_simulations=10, search__widen_tool_call=False)
    batch = search_batch(tasks[:1], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
    root = batch.table[0]
    assert root.widen_rounds
    assert batch.budget.total == policy.stats.generated_tokens == TOKENS * (2 + sum(r.samples for r in root.widen_rounds))


def test_no_widening_below_a_success(env, tasks):
    """Node A (after the right call) has one candidate. When it is the gold answer, A is
    exhausted with a success below and is never widened; when it is a wrong answer, A is."""
    task = tasks[1]  # What is 4628 * 289? (one multiply)
    gold = task.gold.calls[0]
    right = call(gold.name, gold.arguments["a"], gold.arguments["b"])

    def run(answer: str):
        policy = RulePolicy(lambda conv, seed, i: [right, "7"][i % 2] if turn(conv) == 0 else answer)
        cfg = config(search__num_simulations=10, search__algorithm="gumbel")
        batch = search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        a = next(n for n in batch.table.nodes if n.depth == 1 and not n.terminal)
        return batch, a

    solved, a = run(task.gold.answer)
    assert a.solved_below and batch_success(solved) and not a.widen_rounds
    failed, a = run("0")
    assert not a.solved_below and not batch_success(failed) and a.widen_rounds


def test_tool_call_widening_opens_a_tool_call_where_every_candidate_answered(env, tasks):
    """The policy only answers unless forced: every first candidate is a wrong bare answer, so the
    root is exhausted without a tool call and its widening rounds are sampled after the forced
    tag; the forced continuation is the right call, and the search then solves the task. With
    widen_tool_call off, widening only repeats answers and the tree stays unsolved."""
    task = tasks[1]  # What is 4628 * 289? (one multiply)
    gold = task.gold.calls[0]
    right = call(gold.name, gold.arguments["a"], gold.arguments["b"])[len("<tool_call>"):]

    def reply(conv, seed, i, prefix):
        if prefix:
            return right
        return task.gold.answer if turn(conv) == 1 else str(1000 + i)

    def run(**overrides):
        policy = RulePolicy(reply)
        cfg = config(search__num_simulations=12, search__algorithm="puct", **overrides)
        batch = search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        return batch, policy

    batch, policy = run()
    root = batch.table[0]
    # The first round is forced; once the root holds a tool call its later rounds are plain.
    assert root.widen_rounds[0].forced and not any(rd.forced for rd in root.widen_rounds[1:])
    tool_edges = [e for e in root.edges if e.forced]
    assert tool_edges and all(e.sample.text.startswith("<tool_call>") and e.action.tool_calls for e in tool_edges)
    assert "<tool_call>" in policy.prefixes and batch_success(batch)
    rows, _ = batch_rows(batch, policy.model_id)
    assert "widen_tool" in {r["origin"] for r in rows}
    # No prefix below the call: the child's candidates are the gold answer.
    child = batch.table[root.children[root.edges.index(tool_edges[0])]]
    assert not any(rd.forced for rd in child.widen_rounds)

    off, policy = run(search__widen_tool_call=False)
    assert not any(rd.forced for rd in off.table[0].widen_rounds) and set(policy.prefixes) == {""}
    assert not batch_success(off)


class NamedToolPolicy(RulePolicy):
    """RulePolicy that scores a forced call opening by the tool it names (`order`: likeliest first)."""

    def __init__(self, reply, order: list[str]):
        super().__init__(reply)
        self.order = order
        self.scored: list[str] = []

    def score(self, convs, continuations, *, end_turn=True):
        assert not end_turn
        self.scored += list(continuations)
        out = []
        for text in continuations:
            name = json.loads(text[len("<tool_call>") :] + "{}}")["name"]
            lp = -1.0 - self.order.index(name)
            out.append(Sample(text, (0,), (lp,), lp, 1, "length"))
        return out


def test_tool_name_widening_forces_the_likeliest_untried_tool_every_other_round(env, tasks):
    """The policy invents a tool name unless one is forced, and writes the right operands after
    any forced name: its likeliest tool (add) gives a wrong answer, multiply the right one. The
    root's rounds force add, then sample freely, then force multiply (the likeliest tool no
    candidate calls yet), and the search solves the task. Without widen_tool_names it never does."""
    task = tasks[1]  # What is 4628 * 289? (one multiply)
    a, b = task.gold.calls[0].arguments["a"], task.gold.calls[0].arguments["b"]

    def reply(conv, seed, i, prefix):
        if turn(conv) >= 1:  # answer with the tool's result
            return conv.messages[-1].content.strip()
        if prefix.startswith('<tool_call>{"name"'):
            return json.dumps({"a": a, "b": b}) + "}</tool_call>"
        return call("times", a, b)

    def run(**overrides):
        policy = NamedToolPolicy(reply, ["add", "multiply", "subtract", "divide"])
        cfg = config(search__num_simulations=24, search__algorithm="puct", **overrides)
        batch = search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        return batch, policy

    batch, policy = run(search__widen_tool_names=True)
    root = batch.table[0]
    tools = [rd.tool for rd in root.widen_rounds]
    assert tools[:3] == ["add", "", "multiply"], tools
    assert root.tool_names[:2] == ["add", "multiply"]
    forced = [e for e in root.edges if e.forced]
    assert forced[0].sample.text.startswith('<tool_call>{"name": "add", "arguments":{')
    assert [c.name for e in forced for c in e.action.tool_calls][:2] == ["add", "multiply"]
    assert batch_success(batch)
    # Scored once per node ranked, one forced opening per offered tool; no tokens charged for it.
    assert len(policy.scored) % len(task.tools) == 0
    assert batch.counters.generated_tokens == TOKENS * sum(len(asked) and k for asked, k in policy.asked)

    off, policy = run()
    assert not any(rd.tool for rd in off.table[0].widen_rounds) and not policy.scored
    assert not batch_success(off)


def batch_success(batch) -> bool:
    return any(n.success for n in batch.table.nodes)


# ---------------------------------------------------------------- greedy candidate


class GreedyRulePolicy(RulePolicy):
    """RulePolicy whose greedy decode (temperature 0) is `greedy(conv)`; its samples at any
    other temperature follow `reply`. temperatures: (temperature, k) of each call."""

    def __init__(self, greedy, reply):
        super().__init__(reply)
        self.greedy = greedy
        self.temperatures: list[tuple[float, int]] = []

    def sample(self, convs, k, *, temperature=1.0, **kwargs):
        self.temperatures.append((temperature, k))
        if temperature > 0:
            return super().sample(convs, k, **kwargs)
        sampled, self.reply = self.reply, lambda conv, seed, i, prefix: self.greedy(conv)
        try:
            return super().sample(convs, k, **kwargs)
        finally:
            self.reply = sampled


class SeparateCalls(HFPolicy):
    """The hf backend with `sample_together` as one `sample` call per request (the interface's
    default, what the search did before decoding an iteration's requests together)."""

    def sample_together(self, requests, *, max_new_tokens=128):
        return Policy.sample_together(self, requests, max_new_tokens=max_new_tokens)


def test_requests_decoded_together_give_the_same_trees_as_one_call_each(env, tiny, tasks):
    """With the greedy candidate and widening (the defaults), the search decodes an expansion's
    greedy and sampled rows, and an iteration's widening rounds, in one policy loop each: the
    trees (tensors, edges, priors, log-probs) are those of one `sample` call per request, in
    fewer calls."""
    cfg = config(search__num_simulations=12, search__greedy_candidate=True, policy__temperature=0.7)
    reward = make_reward(cfg, env)

    def run(policy):
        policy.stats.reset()
        batch = search_batch(tasks[:2], policy=policy, env=env, reward=reward, config=cfg, seed=0)
        edges = [[(e.sample.token_ids, e.sample.logprobs, e.count, e.mass, e.greedy, e.round) for e in n.edges] for n in batch.table.nodes]
        return batch, edges, policy.stats.calls

    together, edges, calls = run(tiny)
    separate, edges_separate, calls_separate = run(SeparateCalls(tiny.model, tiny.tokenizer))
    assert edges == edges_separate and any(n.widen_rounds for n in together.table.nodes)
    for field in dataclasses.fields(together.tree):
        assert torch.equal(getattr(together.tree, field.name), getattr(separate.tree, field.name)), field.name
    assert calls < calls_separate


def test_greedy_candidate_puts_the_greedy_decode_first_at_every_expansion(env):
    """The greedy decode solves the task and the samples never do (they call with wrong numbers):
    plain sampled candidates find no success; with `greedy_candidate` every expanded node's
    edge 0 is the greedy continuation (K - 1 sampled beside it, same K tokens charged), the
    tree solves the task along it, and the node rows name those nodes `greedy`."""
    task = next(t for t in generate_suite("arithmetic", n_train=20, n_heldout=0, seed=0) if len(t.gold.calls) == 1)
    calls = task.gold.calls

    def greedy(conv):
        t = turn(conv)
        if t < len(calls):
            return f'<tool_call>{json.dumps({"name": calls[t].name, "arguments": calls[t].arguments})}</tool_call>'
        return conv.messages[-1].content.split()[0]  # the last tool output, right only after the right call

    def wrong(conv, seed, i):
        return call(calls[0].name, 1000 + i, 7) if turn(conv) == 0 else "-1"

    def run(on):
        policy = GreedyRulePolicy(greedy, wrong)
        cfg = config(search__widening=False, search__num_simulations=12, search__greedy_candidate=on)
        return policy, search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)

    policy, off = run(False)
    assert not batch_success(off) and all(t > 0 for t, _ in policy.temperatures)
    policy, on = run(True)
    assert batch_success(on)
    assert policy.temperatures[:2] == [(0.0, 1), (1.0, 1)]  # greedy, then K - 1 = 1 sampled
    expanded = [n for n in on.table.nodes if n.edges]
    assert expanded and all(n.edges[0].greedy and not any(e.greedy for e in n.edges[1:]) for n in expanded)
    assert on.table.budget.used[0] == TOKENS * 2 * len(expanded)
    solved = next(n for n in on.table.nodes if n.success)
    path = [on.table[h] for h in on.table.path(on.table.nodes.index(solved))]
    assert [n.origin for n in path] == ["root"] + ["greedy"] * (len(path) - 1)
    nodes, _ = batch_rows(on, "rules@0")
    assert {r["origin"] for r in nodes} == {"root", "greedy", "expand"}


# ---------------------------------------------------------------- transpositions


def two_calls_policy() -> RulePolicy:
    """Turns 0 and 1 offer add(1, 2) and multiply(3, 4); later turns answer 15."""
    return RulePolicy(lambda conv, seed, i: [call("add", 1, 2), call("multiply", 3, 4)][i % 2] if turn(conv) < 2 else "15")


def test_two_paths_to_one_state_share_its_value_estimate(env, tasks):
    """add then multiply, and multiply then add, reach one state (stateless tools, the same
    turns in another order): the second node is a transposition of the first and reuses its
    rollout value; no rollout starts from it. Its own candidates are still sampled."""
    policy = two_calls_policy()
    cfg = config(search__value="rollout", search__num_actions=2)
    expander = LLMExpander(policy, env, make_reward(cfg, env), cfg.search, cfg.policy, rollouts=2, seed=0)
    expander.roots([tasks[1]])
    one = torch.ones((1, 2), dtype=torch.bool)
    first = expander(torch.tensor([[0, 0]]), torch.tensor([[0, 1]]), one)
    a, b = first.handle[0].tolist()  # after add, after multiply
    asked = len(policy.asked)
    second = expander(torch.tensor([[a, b]]), torch.tensor([[1, 0]]), one)
    ab, ba = second.handle[0].tolist()
    x, y = expander.table[ab], expander.table[ba]
    assert x.state.state_hash == y.state.state_hash and x.state.prefix_hash != y.state.prefix_hash
    assert transposition_key(x.state) == transposition_key(y.state)
    assert x.transposition_of is None and y.transposition_of == ab
    assert y.value_estimate == x.value_estimate and second.value[0, 0] == second.value[0, 1]
    assert expander.counters.transpositions == 1 and expander.counters.values_reused == 1
    # This call's rollouts (k=1 turns; they start from x, its only fresh non-terminal node).
    rollout_starts = [m for m, k in policy.asked[asked:] if k == 1]
    assert x.state.messages in rollout_starts and y.state.messages not in rollout_starts
    assert y.edges and (y.state.messages, 2) in policy.asked[asked:]
    # The answers after either order are terminal transpositions too; each is scored itself.
    third = expander(torch.tensor([[ab, ba]]), torch.tensor([[0, 0]]), one)
    t1, t2 = (expander.table[h] for h in third.handle[0].tolist())
    assert t1.terminal and t2.terminal and t2.transposition_of == third.handle[0, 0].item()
    assert t1.verdicts and t2.verdicts and t1.reward == t2.reward
    # Different states are not transpositions: add then add.
    other = expander(torch.tensor([[a]]), torch.tensor([[0]]), torch.ones((1, 1), dtype=torch.bool))
    assert expander.table[int(other.handle[0, 0])].transposition_of is None


def test_transpositions_in_the_node_rows(env, tasks):
    policy = two_calls_policy()
    cfg = config(search__num_simulations=16, search__algorithm="gumbel", search__max_depth=3, search__widening=False)
    reward = make_reward(cfg, env)
    batch = search_batch([tasks[1]], policy=policy, env=env, reward=reward, config=cfg, seed=0)
    nodes, _ = batch_rows(batch, policy.model_id)
    by_id = rows_by_tree(nodes)[tasks[1].id]
    linked = [r for r in by_id.values() if r["transposition_of"] is not None]
    assert linked
    for r in linked:
        first = by_id[r["transposition_of"]]
        assert first["node_id"] < r["node_id"] and first["transposition_of"] is None
        assert first["env_hash"] == r["env_hash"] and first["depth"] == r["depth"]
        assert first["prefix_hash"] != r["prefix_hash"]
        assert messages(first) != messages(r) and Counter(messages(first)) == Counter(messages(r))
        if not r["terminal"]:
            assert r["value_estimate"] == first["value_estimate"]
    off = search_batch(
        [tasks[1]], policy=two_calls_policy(), env=env, reward=reward,
        config=config(search__num_simulations=16, search__algorithm="gumbel", search__max_depth=3, search__widening=False,
                      search__transpositions=False),
        seed=0,
    )
    rows, _ = batch_rows(off, policy.model_id)
    assert all(r["transposition_of"] is None for r in rows)


# ---------------------------------------------------------------- budget across trees


def budget_policy(tasks) -> RulePolicy:
    """Solves tasks[1] (the right call, then the gold answer); elsewhere wrong answers that
    differ by seed and sample, so widening keeps finding new candidates."""
    solved = tasks[1]
    gold = solved.gold.calls[0]
    right = call(gold.name, gold.arguments["a"], gold.arguments["b"])

    def reply(conv: Conversation, seed: int, i: int) -> str:
        if conv.messages[: len(solved.messages)] == tuple(solved.messages):
            return [right, "0"][i % 2] if turn(conv) == 0 else solved.gold.answer
        return str(1000 + (seed * 31 + i * 7) % 997)

    return RulePolicy(reply)


def test_solved_tree_gives_its_budget_to_unsolved_trees(env, tasks):
    limit = 32
    reward = make_reward(config(), env)

    def run(policy_name: str):
        cfg = config(
            search__num_simulations=30, search__max_actions=12, search__max_generated_tokens=limit,
            search__solved_policy=policy_name,
        )
        batch = search_batch(tasks, policy=budget_policy(tasks), env=env, reward=reward, config=cfg, seed=0)
        return batch, rows_by_tree(batch_rows(batch, "rules@0")[0])

    stop, rows = run("stop")
    budget: TokenBudget = stop.budget
    assert any(n.success for n in stop.table.nodes if n.tree == 1)
    assert budget.given[1] > 0 and budget.received[1] == 0
    assert budget.given[0] == budget.given[2] == 0
    assert budget.received[0] + budget.received[2] == budget.given[1]
    assert abs(budget.received[0] - budget.received[2]) <= 1
    # The solved tree stopped; the unsolved ones kept searching and spent the tokens they got.
    sims = stop.tree.num_simulations.tolist()
    assert sims[1] < 30 and sims[0] == sims[2] == 30
    assert max(budget.used[0], budget.used[2]) > limit
    assert budget.used[1] + budget.given[1] == limit + budget.received[1] or budget.used[1] >= limit
    for b, task in enumerate(tasks):
        root = rows[task.id][0]
        assert root["budget_received"] == budget.received[b] and root["budget_given"] == budget.given[b]
        assert all(r["budget_received"] is None for r in rows[task.id].values() if r["node_id"] > 0)

    cont, rows = run("continue")
    assert cont.budget.received == [0, 0, 0] and cont.budget.given == [0, 0, 0]
    assert cont.tree.num_simulations.tolist() == [30, 30, 30]
    assert all(used <= limit + 2 * TOKENS for used in cont.budget.used)
    assert rows[tasks[0].id][0]["budget_received"] == 0


def test_token_budget_transfer():
    budget = TokenBudget.for_tasks(3, limit=10)
    budget.charge(0, 3)
    assert budget.transfer(0, [0, 1, 2]) == 7
    assert budget.given == [7, 0, 0] and budget.received == [0, 4, 3] and budget.exhausted(0)
    assert budget.limit_of(1) == 14 and budget.remaining(2) == 13
    assert budget.transfer(0, [1]) == 0 and budget.transfer(1, []) == 0


# ---------------------------------------------------------------- determinism, run id


def test_same_seed_same_trees_with_every_feature(env, tiny, tasks):
    cfg = config(search__num_simulations=8, search__solved_policy="stop")
    reward = make_reward(cfg, env)

    def rows(seed):
        batch = search_batch(tasks[:2], policy=tiny, env=env, reward=reward, config=cfg, seed=seed)
        nodes, _ = batch_rows(batch, tiny.model_id)
        return [
            (r["tree_id"], r["node_id"], r["action_text"], r["visits"], round(r["q"], 6), r["origin"], r["widen_round"],
             r["transposition_of"], r["budget_received"])
            for r in nodes
        ]

    first = rows(0)
    assert any(r[5] == "widen" for r in first)
    assert rows(0) == first
    assert rows(1) != first


@pytest.mark.parametrize(
    "field, value",
    [("widening", False), ("widen_c", 1.0), ("widen_alpha", 0.7), ("max_actions", 8), ("transpositions", False),
     ("solved_policy", "stop"), ("widen_tool_call", False), ("objective", "success"), ("greedy_candidate", False),
     ("widen_tool_names", True), ("min_leaves", 8)],
)
def test_every_new_search_setting_is_in_the_generate_run_id(field, value, tasks):
    base = EngineConfig()
    changed = load_config(None, **{f"search__{field}": value})
    assert getattr(changed.search, field) == value != getattr(base.search, field)
    assert changed.output_settings()["search"][field] == value
    assert default_run_id(changed, tasks) != default_run_id(base, tasks)


def test_bad_solved_policy_is_named():
    with pytest.raises(ValueError, match="search.solved_policy"):
        load_config(None, search__solved_policy="pause")


# ---------------------------------------------------------------- store columns


def test_nodes_written_before_the_new_columns_read_as_null(tmp_path, monkeypatch):
    """A nodes table created by the schema before origin, widen_round, transposition_of and
    the budget columns: it still reads (the new columns null), and new rows append to it."""
    from storage import schemas
    from storage.store import Store

    new = ("origin", "widen_round", "transposition_of", "budget_received", "budget_given")
    old = schemas.TableSpec("nodes", schemas.NODES.row, tuple(c for c in schemas.NODES.columns if c.name not in new))
    row = {"task_id": "t", "tree_id": "t", "node_id": 0, "visits": 1}
    with monkeypatch.context() as m:
        m.setitem(schemas.TABLES, "nodes", old)
        Store(tmp_path / "s").append("nodes", [row], run_id="r", shard_id="old")
    store = Store(tmp_path / "s")
    frame = store.nodes().collect()
    assert set(new) <= set(frame.columns) and all(frame[c].null_count() == 1 for c in new)
    store.append("nodes", [{**row, "origin": "root", "budget_received": 5}], run_id="r", shard_id="new")
    frame = store.nodes().sort("shard_id").collect()
    assert frame["origin"].to_list() == ["root", None] and frame["budget_received"].to_list() == [5, None]


def test_transposition_key_keeps_the_order_of_user_turns(env, tasks):
    """Turns may be reordered within a user turn, not across one: a step whose observations
    hold the next user message closes a segment of the key."""
    from dataengine.types import Message, Step

    state = env.reset(tasks[1])
    add, mul = (env.step(state, c).state.steps[0] for c in (call("add", 1, 2), call("multiply", 3, 4)))
    user = Message(role="user", content="And now?")
    turn_end = Step(action=add.action, observations=[*add.observations, user], results=add.results)

    def at(*steps):
        return dataclasses.replace(state, steps=tuple(steps))

    assert transposition_key(at(add, mul)) == transposition_key(at(mul, add))
    assert transposition_key(at(turn_end, mul)) != transposition_key(at(mul, turn_end))


# ---------------------------------------------------------------- argument variants


def test_argument_variants_swap_one_numeric_argument_for_a_number_the_conversation_shows():
    from dataengine.parsing import parse_action
    from dataengine.search.variants import argument_variants, context_numbers
    from dataengine.types import Message

    messages = [
        Message(role="system", content="worked example: 99 and 98"),
        Message(role="user", content="What is (1708 / 14) / 61? Reply with x2."),
        Message(role="assistant", content=call("divide", 1708, 14)),
        Message(role="tool", content='{"result": 122}'),
    ]
    # The tool's result first, then the question's numbers; not the system prompt's, not "x2".
    assert context_numbers(messages) == [122, 1708, 14, 61]
    texts = argument_variants(parse_action(call("divide", 122, 14)), context_numbers(messages))
    keys = [parse_action(t).key() for t in texts]
    assert parse_action(call("divide", 122, 61)).key() in keys
    assert len(keys) == len(set(keys)) == 6  # a in {1708, 14, 61}, b in {122, 1708, 61}
    assert all(t.startswith("<tool_call>{\"name\": \"divide\"") and t.endswith("</tool_call>") for t in texts)
    # Booleans and strings are left alone; an answer has no variants.
    flag = parse_action('<tool_call>{"name": "f", "arguments": {"x": true, "u": "km"}}</tool_call>')
    assert argument_variants(flag, [1, 2]) == [] and argument_variants(parse_action("42"), [1, 2]) == []


def test_tool_swaps_offer_the_other_tools_that_take_the_same_arguments():
    from dataengine.parsing import parse_action
    from dataengine.search.variants import argument_variants, same_signature
    from dataengine.types import ToolSpec

    def spec(name, *params):
        return ToolSpec(name=name, description=name, parameters={"type": "object", "properties": {p: {"type": "number"} for p in params}})

    swaps = same_signature([spec("add", "a", "b"), spec("multiply", "a", "b"), spec("sqrt", "x"), spec("pow", "b", "a")])
    assert swaps == {"add": ["multiply", "pow"], "multiply": ["add", "pow"], "sqrt": [], "pow": ["add", "multiply"]}
    texts = argument_variants(parse_action(call("add", 51, 3)), [338], swaps=swaps)
    keys = [parse_action(t).key() for t in texts]
    # One numeric argument at a time, then the tool swaps (same arguments).
    assert keys[:2] == [parse_action(call("add", 338, 3)).key(), parse_action(call("add", 51, 338)).key()]
    assert keys[2:] == [parse_action(call("multiply", 51, 3)).key(), parse_action(call("pow", 51, 3)).key()]
    # Two edits (tool and operand) are a variant of a variant: a later round's.
    second = {parse_action(t).key() for t in argument_variants(parse_action(texts[2]), [338], swaps=swaps)}
    assert parse_action(call("multiply", 51, 338)).key() in second


def units_call(**arguments) -> str:
    return f'<tool_call>{json.dumps({"name": "convert", "arguments": arguments})}</tool_call>'


def test_schema_variants_name_enum_values_fill_missing_arguments_and_exchange_two():
    """widen_arguments 'schema': enum values the conversation names, the closest ones to a value
    outside the enum, a required argument the call left out, two arguments exchanged; none of
    them without the schemas (the numeric rounds stay as they were)."""
    from dataengine.parsing import parse_action
    from dataengine.search.variants import argument_variants, context_numbers, context_text, named_values

    task = next(t for t in generate_suite("units", n_train=20, n_heldout=0, seed=0) if "US gallons" in t.messages[-1].content)
    schemas = {t.name: t.parameters for t in task.tools}
    text, numbers = context_text(task.messages), context_numbers(task.messages)
    gold = task.gold.calls[0].arguments
    value, src, dst = gold["value"], gold["from_unit"], gold["to_unit"]
    assert src == "us_gallon" and set(named_values(schemas["convert"]["properties"]["to_unit"]["enum"], text)) >= {src, dst}

    def keys(action_text, **kw):
        return [parse_action(t).key() for t in argument_variants(parse_action(action_text), numbers, **kw)]

    key = parse_action(units_call(value=value, from_unit=src, to_unit=dst)).key()
    # SmolLM2's commonest miss: no from_unit. The schema fills it with a unit the question names.
    missing = units_call(value=value, to_unit=dst)
    assert key not in keys(missing) and key in keys(missing, schemas=schemas, text=text)
    # A unit outside the enum: the closest enum value ('gallons' -> 'us_gallon').
    assert key in keys(units_call(value=value, from_unit="gallons", to_unit=dst), schemas=schemas, text=text)
    # The units in the question's order: one exchange away.
    swapped = keys(units_call(value=value, from_unit=dst, to_unit=src), schemas=schemas, text=text)
    assert key in swapped and len(swapped) == len(set(swapped))
    # A unit the conversation does not name is never offered (no gold read: 'kelvin' is not in the text).
    assert "kelvin" not in text and all("kelvin" not in k for k in map(str, swapped))
    # Word starts only: 'gram' is not named by 'kilograms'.
    assert named_values(["gram", "kilogram"], "3 kilograms") == ["kilogram"]
    # A missing required number is filled from the context numbers.
    schema = {"f": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}
    filled = argument_variants(parse_action('<tool_call>{"name": "f", "arguments": {}}</tool_call>'), [3, 4],
                               schemas=schema, text="")
    assert [parse_action(t).tool_calls[0].arguments for t in filled] == [{"x": 3}, {"x": 4}]


def test_schema_variants_solve_the_units_call_the_policy_gets_wrong(env):
    """The policy always calls convert without from_unit (as SmolLM2 mostly does on units), then
    answers with the last tool output. Numeric variants cannot mend that call; schema variants
    add the missing unit and the search solves the task, through a variant edge."""
    task = next(t for t in generate_suite("units", n_train=20, n_heldout=0, seed=0) if t.metadata.get("level") == 1)
    gold = task.gold.calls[0].arguments

    def reply(conv, seed, i):
        if turn(conv) == 0:
            return units_call(value=gold["value"], to_unit=gold["to_unit"])
        return conv.messages[-1].content.split()[0]

    def run(mode):
        policy = ScoringRulePolicy(reply)
        cfg = config(search__num_simulations=24, search__widen_tool_call=False, search__widen_arguments=mode)
        return search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)

    assert not batch_success(run(True))
    on = run("schema")
    assert batch_success(on)
    solved = next(n for n in on.table.nodes if n.success)
    path = [on.table[h] for h in on.table.path(on.table.nodes.index(solved))]
    assert any(n.edge is not None and n.edge.variant for n in path)


class ScoringRulePolicy(RulePolicy):
    """RulePolicy that also scores: every continuation gets TOKENS tokens of log-prob -1 in all."""

    def __init__(self, reply):
        super().__init__(reply)
        self.scored: list[str] = []

    def score(self, convs, continuations, *, end_turn=True):
        self.scored += list(continuations)
        return [Sample(t, tuple(range(TOKENS)), (-1.0 / TOKENS,) * TOKENS, -1.0, TOKENS, "stop") for t in continuations]


def test_argument_variants_reach_the_second_call_the_policy_gets_wrong(env):
    """A two-call task: the policy makes the right first call, then always the second call with
    a wrong operand (7), then answers the last tool result. Sampling never finds the right
    second call; a variant round swaps the operand for a number the question shows, and the
    search solves the task. The variant edges are marked, charged to the tree and stored with
    origin widen_args."""
    import re

    task = next(t for t in generate_suite("arithmetic", n_train=40, n_heldout=0, seed=0) if len(t.gold.calls) == 2)
    first, second = task.gold.calls
    wrong = {**second.arguments, **{k: 7 for k, v in second.arguments.items() if str(v) in task.messages[-1].content}}
    assert wrong != second.arguments

    def text(c, args):
        return f'<tool_call>{json.dumps({"name": c.name, "arguments": args})}</tool_call>'

    def reply(conv, seed, i):
        t = turn(conv)
        if t == 0:
            return text(first, first.arguments)
        if t == 1:
            return text(second, wrong)
        return re.findall(r"-?\d+(?:\.\d+)?", conv.messages[-1].content)[-1]

    def run(**overrides):
        policy = ScoringRulePolicy(reply)
        cfg = config(search__num_simulations=48, search__widen_tool_call=False, **overrides)
        batch = search_batch([task], policy=policy, env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        return batch, policy

    off, policy = run()
    assert not batch_success(off) and not policy.scored
    on, policy = run(search__widen_arguments=True)
    assert batch_success(on) and policy.scored
    solved = next(n for n in on.table.nodes if n.success)
    path = [on.table[h] for h in on.table.path(on.table.nodes.index(solved))]
    assert any(n.edge is not None and n.edge.variant for n in path)
    rounds = [rd for n in on.table.nodes for rd in n.widen_rounds]
    assert any(rd.variants and not rd.samples for rd in rounds)
    # Variant rounds alternate with sampling rounds at a node.
    for n in on.table.nodes:
        kinds = [bool(rd.variants) for rd in n.widen_rounds]
        assert all(not (a and b) for a, b in zip(kinds, kinds[1:]))
    added = sum(rd.variants for rd in rounds)
    assert on.counters.variant_edges == added and on.counters.variant_tokens == TOKENS * added
    assert on.budget.total == policy.stats.generated_tokens + TOKENS * added
    rows, _ = batch_rows(on, policy.model_id)
    assert sum(r["origin"] == "widen_args" for r in rows) == sum(n.edge is not None and n.edge.variant for n in on.table.nodes) > 0


# ---------------------------------------------------------------- search objective


def test_success_objective_backs_up_success_and_rows_keep_the_composite_reward(env, tasks):
    """Every episode ends in a well-formed wrong answer. The composite reward pays it shaping
    (> 0), which the tree backs up under objective "composite"; under "success" the tree sees 0
    everywhere, while the node rows store the same composite rewards in both runs."""

    def reply(conv, seed, i):
        return str(1000 + i)

    out = {}
    for objective in ("composite", "success"):
        cfg = config(search__objective=objective)
        batch = search_batch(tasks[:1], policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        assert not batch_success(batch)
        out[objective] = batch_rows(batch, "rules@0")[0]
    composite, success = out["composite"], out["success"]
    terminal = [r for r in composite if r["terminal"]]
    assert terminal and all(r["reward"] > 0 for r in terminal)
    assert [r["reward"] for r in success] == [r["reward"] for r in composite]
    assert max(r["q"] for r in composite) > 0
    assert all(r["q"] == 0 for r in success)


def test_success_objective_scores_rollouts_by_success(env, tasks):
    from dataengine.search.adapter import LeafValue

    task = tasks[0]
    gold_answer = task.gold.answer

    def run(reply, objective):
        cfg = config()
        values = LeafValue("rollout", policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env),
                           max_new_tokens=4, temperature=1.0, rollouts=2, objective=objective)
        return values.estimate([env.reset(task)])[0]

    calls = task.gold.calls

    def right(conv, seed, i):
        t = turn(conv)
        if t < len(calls):
            return f'<tool_call>{json.dumps({"name": calls[t].name, "arguments": calls[t].arguments})}</tool_call>'
        return str(gold_answer)

    wrong = lambda conv, seed, i: "-1"  # noqa: E731
    assert run(wrong, "composite") > 0 and run(wrong, "success") == 0
    assert run(right, "success") == 1.0


def test_efficient_success_objective_halves_a_success_with_a_repeated_call(env, tasks):
    """A one-call task: after the right call the policy answers or repeats the call. Under
    "efficient_success" the clean success backs up 1 and the repeated one 1/3 (one step beyond
    the reference plus one repeat), so the step pairs prefer answering; under "success" both
    are worth 1 and no pair separates them. The composite reward in the rows is the same."""
    from dataengine.derive.pairs import step_pairs

    task = tasks[1]  # What is 4628 * 289? (one multiply)
    gold = task.gold.calls[0]
    right = call(gold.name, gold.arguments["a"], gold.arguments["b"])

    def reply(conv, seed, i):
        return [right, [task.gold.answer, right][i % 2], task.gold.answer][min(turn(conv), 2)]

    q, pairs = {}, {}
    for objective in ("success", "efficient_success"):
        cfg = config(search__objective=objective, search__num_simulations=12, search__widening=False, search__value="rollout")
        batch = search_batch([task], policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        rows = batch_rows(batch, "rules@0")[0]
        q[objective] = sorted((r["depth"], round(r["q"], 4)) for r in rows if r["terminal"] and r["success"])
        pairs[objective] = step_pairs(pl.DataFrame(rows).lazy().with_columns(run_id=pl.lit("r"))).collect()
    assert q["success"] == [(2, 1.0), (3, 1.0)]
    assert q["efficient_success"] == [(2, 1.0), (3, round(1 / 3, 4))]
    assert pairs["success"].height == 0
    (pair,) = pairs["efficient_success"].iter_rows(named=True)
    assert task.gold.answer in pair["chosen_json"] and "tool_call" in pair["rejected_json"]


def test_only_a_clean_success_solves_a_tree_under_efficient_success(env, tasks):
    """The policy always repeats its call before answering: under "success" the first success
    stops the tree (solved_policy "stop"); under "efficient_success" that success wastes steps,
    so the tree keeps searching for a shorter one."""
    task = tasks[1]
    gold = task.gold.calls[0]
    right = call(gold.name, gold.arguments["a"], gold.arguments["b"])

    def reply(conv, seed, i):
        return task.gold.answer if turn(conv) >= 2 else right

    sims = {}
    for objective in ("success", "efficient_success"):
        cfg = config(search__objective=objective, search__num_simulations=12, search__solved_policy="stop")
        batch = search_batch([task], policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
        assert batch_success(batch)
        sims[objective] = int(batch.tree.num_simulations[0])
    assert sims["success"] < 12 == sims["efficient_success"]


def test_efficiency_score_counts_steps_beyond_the_reference_and_repeats():
    from dataengine.types import Action, Episode, Step, ToolCall
    from dataengine.verifiers.efficiency import efficiency_score

    task = generate_suite("arithmetic", n_train=2, n_heldout=0, seed=0)[1]
    gold = task.gold.calls[0]
    act = Action(text="", tool_calls=[ToolCall(name=gold.name, arguments=gold.arguments)])
    answer = Action(text=str(task.gold.answer), final_answer=str(task.gold.answer))

    def episode(*actions):
        return Episode(task=task, steps=[Step(action=a) for a in actions])

    assert efficiency_score(episode(act, answer)) == 1.0
    assert efficiency_score(episode(act, act, answer)) == 1 / 3
    assert efficiency_score(episode(act, answer), slack=1) == 1.0


# ---------------------------------------------------------------- reference value (oracle-assisted)


def test_reference_progress_counts_leading_reference_calls():
    from dataengine.types import ToolCall
    from dataengine.values import reference_progress

    task = next(t for t in generate_suite("arithmetic", n_train=40, n_heldout=0, seed=0) if len(t.gold.calls) == 2)
    first, second = task.gold.calls
    wrong = ToolCall(name=second.name, arguments={k: 7 for k in second.arguments})
    assert reference_progress(task, []) == 0
    assert reference_progress(task, [first]) == pytest.approx(1 / 3)
    assert reference_progress(task, [first, second]) == pytest.approx(2 / 3)
    assert reference_progress(task, [first, wrong]) == pytest.approx(1 / 3)
    assert reference_progress(task, [wrong, second]) == 0
    assert reference_progress(task, [first, second, wrong]) == pytest.approx(2 / 3)
    notool = generate_suite("notool", n_train=1, n_heldout=0, seed=0)[0]
    assert not notool.gold.calls and reference_progress(notool, []) == 0


def test_reference_value_rates_nodes_by_progress_along_the_reference_calls(env):
    """Leaf value "reference": the node after the right first call is worth 1/3 of a success, a
    node after a wrong first call 0; the search that uses it solves the task."""
    import re

    task = next(t for t in generate_suite("arithmetic", n_train=40, n_heldout=0, seed=0) if len(t.gold.calls) == 2)
    first, second = task.gold.calls

    def text(c, args):
        return f'<tool_call>{json.dumps({"name": c.name, "arguments": args})}</tool_call>'

    def reply(conv, seed, i):
        t = turn(conv)
        if t == 0:
            return text(first, first.arguments) if i == 1 else text(first, {k: 7 for k in first.arguments})
        if t == 1:
            return text(second, second.arguments) if i == 1 else "0"
        return re.findall(r"-?\d+(?:\.\d+)?", conv.messages[-1].content)[-1]

    cfg = config(search__value="reference", search__objective="success", search__num_simulations=12)
    batch = search_batch([task], policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
    assert batch_success(batch)
    by_calls = {}
    for n in batch.table.nodes:
        calls = tuple(json.dumps(c.model_dump(), sort_keys=True) for s in n.state.steps for c in s.action.tool_calls)
        if not n.terminal and len(calls) == 1:
            by_calls[calls[0]] = n.value_estimate
    right = json.dumps(first.model_dump(), sort_keys=True)
    assert by_calls[right] == pytest.approx(1 / 3)
    assert [v for k, v in by_calls.items() if k != right] == [0.0]
