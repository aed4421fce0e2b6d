"""Multi-turn episodes: the user-turn schedule, ToolEnv turns (schedule and user-simulator hook),
MultiTurnVerifier's per-turn rules, and parity with BFCL's own multi-turn checker."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from dataengine.env import EnvState, ToolEnv
from dataengine.parsing import render_tool_calls
from dataengine.policy import Policy, PolicyStats, Sample
from dataengine.tools.registry import Toolbox, register_toolbox, tool_from_callable
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec, UserTurn
from dataengine.verifiers import CompositeReward, MultiTurnVerifier, run_turns

HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None
external = [pytest.mark.external, pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")]

# A stateful toolbox defined here; workers import this module through Sandbox(modules=...).


def deposit(state: dict, account: str, amount: int) -> int:
    """Deposit money into an account and return the new balance.

    Args:
        state: The bank (injected).
        account: The account name.
        amount: How much to deposit.
    """
    if amount <= 0:
        raise ValueError("amount must be positive")
    balances = state.setdefault("balances", {})
    balances[account] = balances.get(account, 0) + amount
    return balances[account]


def balance(state: dict, account: str) -> int:
    """Read an account's balance.

    Args:
        state: The bank (injected).
        account: The account name.
    """
    return state.get("balances", {}).get(account, 0)


def withdraw(state: dict, account: str, amount: int) -> int:
    """Take money out of an account and return the new balance.

    Args:
        state: The bank (injected).
        account: The account name.
        amount: How much to take out.
    """
    balances = state.setdefault("balances", {})
    balances[account] = balances.get(account, 0) - amount
    return balances[account]


BOX = register_toolbox(
    Toolbox(
        name="mt-test-bank",
        tools={t.name: t for t in map(tool_from_callable, [deposit, balance, withdraw])},
        make_initial_state=lambda task: {"balances": {"alice": 10}},
    )
)
SPECS = {name: tool.spec for name, tool in BOX.tools.items()}


def c(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def bank_task(**overrides) -> Task:
    """Three user turns: deposit for bob; read alice's balance; (withdraw offered from here) take 2 from alice."""
    fields = dict(
        id="bank-mt",
        suite="bank",
        messages=[user("Give bob 5.")],
        tools=[SPECS["deposit"], SPECS["balance"]],
        toolbox="mt-test-bank",
        initial_state={"balances": {"alice": 10}},
        user_turns=[
            UserTurn(messages=[user("What does alice have?")]),
            UserTurn(messages=[user("Take 2 from alice.")], tools=[SPECS["withdraw"]]),
        ],
        gold=Gold(turn_calls=[[c("deposit", account="bob", amount=5)], [c("balance", account="alice")],
                              [c("withdraw", account="alice", amount=2)]]),
    )
    fields.update(overrides)
    return Task(**fields)


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=2, timeout_s=5.0, modules=[__name__]) as sb:
        yield ToolEnv(sb, max_steps=3)


def play(env: ToolEnv, state: EnvState, texts: Sequence[str]) -> EnvState:
    for text in texts:
        state = env.step(state, text).state
    return state


def calls_text(*calls: ToolCall) -> str:
    return render_tool_calls(list(calls))


def gold_texts(task: Task) -> list[str]:
    return [t for turn in task.gold.turn_calls for t in ([calls_text(*turn)] if turn else []) + ["Done."]]


# ---------------------------------------------------------------- the schedule and its validation


def test_gold_calls_are_the_turns_concatenated():
    task = bank_task()
    assert task.num_turns == 3 and [x.name for x in task.gold.calls] == ["deposit", "balance", "withdraw"]
    assert Task.model_validate_json(task.model_dump_json()) == task  # stored tasks keep their schedule
    with pytest.raises(ValidationError, match="gold.calls must be the concatenation of gold.turn_calls"):
        Gold(calls=[c("balance", account="bob")], turn_calls=[[c("deposit", account="bob", amount=5)]])


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"user_turns": [UserTurn(messages=[])]}, "user_turns[0].messages: a user turn needs at least one message"),
        ({"user_turns": [UserTurn(messages=[user("ok")]), UserTurn(messages=[user("  ")])]},
         "user_turns[1].messages[0].content: the user message is empty"),
        ({"user_turns": [UserTurn(messages=[Message(role="assistant", content="hi")])]},
         "user_turns[0].messages[0].role: a user turn holds user messages, got 'assistant'"),
        ({"user_turns": [UserTurn(messages=[user("again")], tools=[SPECS["deposit"]])]},
         "user_turns[0].tools[0]: tool 'deposit' is already offered before this turn"),
        ({"user_turns": [UserTurn(messages=[user("more")])]},
         "gold.turn_calls: 3 turns of gold calls for a task of 2 user turns (1 + len(user_turns))"),
    ],
)
def test_malformed_schedule_is_a_validation_error_naming_task_and_field(overrides, problem):
    with pytest.raises(ValidationError) as info:
        bank_task(**overrides)
    assert f"task 'bank-mt': {problem}" in str(info.value)


def test_malformed_schedule_in_a_task_file_names_the_line(tmp_path):
    from dataengine.suites.io import TaskFileError, load_tasks

    good = json.loads(bank_task().model_dump_json())
    bad = json.loads(bank_task(id="bank-2").model_dump_json())
    bad["user_turns"][0]["messages"] = []
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 2: ") and "task 'bank-2': user_turns[0].messages: a user turn needs at least one message" in message


def test_functions_missing_from_the_toolbox_are_refused_at_load_and_reset(env, tmp_path):
    from dataengine.suites.io import TaskFileError, load_tasks

    alien = ToolSpec(name="teleport", description="Move money anywhere.")
    task = bank_task(user_turns=[UserTurn(messages=[user("What does alice have?")]),
                                 UserTurn(messages=[user("Take 2 from alice.")], tools=[SPECS["withdraw"], alien])])
    problem = "task 'bank-mt': user_turns[1].tools[1]: 'teleport' is not a tool of toolbox 'mt-test-bank'"
    with pytest.raises(ValueError) as info:
        env.reset(task)
    assert str(info.value) == problem
    path = tmp_path / "tasks.jsonl"
    path.write_text(task.model_dump_json() + "\n")
    with pytest.raises(TaskFileError) as info:
        load_tasks(path)
    assert str(info.value) == f"{path}, line 1, field 'user_turns': {problem}"


# ---------------------------------------------------------------- ToolEnv turns


def test_a_reply_without_calls_starts_the_next_turn(env):
    task = bank_task()
    s0 = env.reset(task)
    s1 = env.step(s0, calls_text(c("deposit", account="bob", amount=5))).state
    out = env.step(s1, "Bob has 5 more.")
    s2 = out.state
    assert not out.done and not s2.terminal and s2.turn == 1 and s2.turn_steps == 0
    assert out.observations == [user("What does alice have?")]
    assert [m.role for m in s2.messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert [s.turn for s in s2.steps] == [0, 0] and s2.turn_states == (s1.tool_state,)
    assert {t.name for t in s2.task.tools} == {"deposit", "balance"}
    s3 = play(env, s2, [calls_text(c("balance", account="alice")), "Alice has 10."])
    # turn 2 offers the held-back function: the state's task is a copy with it (same id, gold and schedule)
    assert s3.turn == 2 and [t.name for t in s3.task.tools] == ["deposit", "balance", "withdraw"]
    assert s3.task.id == task.id and s3.task.gold == task.gold and task.tools == [SPECS["deposit"], SPECS["balance"]]
    end = play(env, s3, [calls_text(c("withdraw", account="alice", amount=2)), "Done."])
    assert end.done and not end.truncated and end.turn == 2
    assert end.tool_state == {"balances": {"alice": 8, "bob": 5}}
    ep = end.episode()
    assert ep.done and [s.turn for s in ep.steps] == [0, 0, 1, 1, 2, 2] and ep.final_answer == "Done."
    assert ep.turn_states == [{"balances": {"alice": 10, "bob": 5}}, {"balances": {"alice": 10, "bob": 5}}]
    with pytest.raises(ValueError, match="terminal"):
        env.step(end, "again")


def test_the_step_limit_counts_per_turn(env):
    # max_steps=3 per turn: 2 calls + the reply in turn 0 fit, then 3 calls in turn 1 truncate
    state = play(env, env.reset(bank_task()), [calls_text(c("balance", account="bob"))] * 2 + ["ok"])
    assert state.turn == 1 and not state.terminal
    state = play(env, state, [calls_text(c("balance", account="bob"))] * 3)
    assert state.truncated and not state.done and state.turn == 1 and state.num_steps == 6


def test_turn_changes_are_deterministic_and_branches_stay_apart(env):
    s0 = env.reset(bank_task())
    s1 = env.step(s0, calls_text(c("deposit", account="bob", amount=5))).state
    a, b = env.step(s1, "Done."), env.step(s1, "Done.")
    assert a.state.messages == b.state.messages and a.state.prefix_hash == b.state.prefix_hash and a.state.turn == 1
    other = env.step(s1, calls_text(c("deposit", account="bob", amount=1))).state  # stays in turn 0
    assert other.turn == 0 and s1.turn == 0 and a.state.tool_state == s1.tool_state


def test_a_user_simulator_hook_drives_the_turns(env):
    """A next_user_turn hook (a user simulator) answers each reply until it has nothing to add."""
    task = Task(id="bank-sim", suite="bank", messages=[user("Give bob 5.")], tools=[SPECS["deposit"], SPECS["balance"]],
                toolbox="mt-test-bank")

    def simulator(state: EnvState) -> UserTurn | None:
        last = state.messages[-1]
        assert last.role == "assistant" and state.turn_steps >= 1  # called right after the reply that ends the turn
        if state.turn == 0:
            return UserTurn(messages=[user(f"You said {last.content!r}. Now take 2 from alice.")], tools=[SPECS["withdraw"]])
        return None  # satisfied: the episode ends

    sim_env = ToolEnv(env.sandbox, max_steps=3, next_user_turn=simulator)
    state = play(sim_env, sim_env.reset(task), [calls_text(c("deposit", account="bob", amount=5)), "Bob got 5."])
    assert state.turn == 1 and state.messages[-1] == user("You said 'Bob got 5.'. Now take 2 from alice.")
    assert "withdraw" in {t.name for t in state.task.tools}
    state = play(sim_env, state, [calls_text(c("withdraw", account="alice", amount=2)), "Taken."])
    assert state.done and state.turn == 1 and state.tool_state == {"balances": {"alice": 8, "bob": 5}}

    broken = ToolEnv(env.sandbox, next_user_turn=lambda s: "more please")  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="next_user_turn must return a UserTurn or None, got str"):
        broken.step(broken.reset(task), "hi")
    silent = ToolEnv(env.sandbox, next_user_turn=lambda s: UserTurn(messages=[user(" ")]))
    with pytest.raises(ValueError, match=r"task 'bank-sim': next_user_turn gave turn 1 with messages\[0\]\.content: the user message is empty"):
        silent.step(silent.reset(task), "hi")


# ---------------------------------------------------------------- MultiTurnVerifier


def verdict_of(task: Task, turns: list[list[ToolCall]]):
    return MultiTurnVerifier().verify(run_turns(task, turns))


def test_gold_passes_and_each_rule_fails_its_case():
    task = bank_task()
    gold = [list(t) for t in task.gold.turn_calls]
    dep, bal, wd = gold[0][0], gold[1][0], gold[2][0]
    other_read = c("balance", account="bob")
    cases = {
        "gold": (gold, None),
        "extra_read": ([[dep, bal], [bal, other_read], [wd]], None),
        # results are looked for among all results so far, as BFCL does: a read made a turn early counts
        "read_a_turn_early_then_another": ([[dep, bal], [other_read], [wd]], None),
        "read_a_turn_early_only": ([[dep, bal], [], [wd]], "empty_turn"),  # turn 1 has gold calls but none
        "read_a_turn_late": ([[dep], [other_read], [bal, wd]], "response_mismatch"),
        "read_missing": ([[dep], [other_read], [wd]], "response_mismatch"),
        "drop_write": ([[], [bal], [wd]], "empty_turn"),
        "write_a_turn_late": ([[other_read], [dep, bal], [wd]], "state_mismatch"),
        "wrong_amount": ([[c("deposit", account="bob", amount=6)], [bal], [wd]], "state_mismatch"),
        "write_a_turn_early": ([[dep, wd], [bal], []], "state_mismatch"),
        "last_turn_empty": ([[dep], [bal], []], "empty_turn"),
    }
    for name, (turns, error) in cases.items():
        v = verdict_of(task, turns)
        assert v.passed is (error is None), (name, v.details)
        if error is not None:
            assert v.details["error_type"] == error, (name, v.details)
            assert v.score == v.details["turn"] / 3
    v = verdict_of(task, [[dep], [other_read], [wd]])
    assert v.details["turn"] == 1 and v.details["missing"] == ["10"]


def test_unfinished_episodes_and_turns_without_gold():
    task = bank_task()
    ep = run_turns(task, [list(t) for t in task.gold.turn_calls[:2]])
    assert not ep.done
    v = MultiTurnVerifier().verify(ep)
    assert v.passed is False and v.details["error_type"] == "unfinished" and v.score == 0.0
    # a turn whose gold has no calls is not checked, but what is done there counts later
    asking = bank_task(gold=Gold(turn_calls=[[c("deposit", account="bob", amount=5)], [], [c("withdraw", account="alice", amount=2)]]))
    assert verdict_of(asking, [[c("deposit", account="bob", amount=5)], [c("balance", account="bob")], [c("withdraw", account="alice", amount=2)]]).passed
    late = verdict_of(asking, [[c("deposit", account="bob", amount=5)], [c("deposit", account="bob", amount=1)], [c("withdraw", account="alice", amount=2)]])
    assert late.passed is False and late.details["error_type"] == "state_mismatch" and late.details["turn"] == 2


def test_composite_success_is_the_per_turn_verdict(env):
    task = bank_task()
    reward = CompositeReward()
    gold = play(env, env.reset(task), gold_texts(task)).episode()
    result = reward.score(gold)
    names = {v.name: v.passed for v in result.verdicts}
    assert result.success and names["multi_turn"] is True and "end_state" not in names
    # all calls in the first turn: the same end state, but the state after turn 0 differs
    flat = play(env, env.reset(task), [calls_text(*task.gold.calls), "Done.", "Done.", "Done."]).episode()
    assert flat.done and flat.final_state == gold.final_state
    result = reward.score(flat)
    v = {v.name: v for v in result.verdicts}["multi_turn"]
    assert not result.success and (v.details["error_type"], v.details["turn"]) == ("state_mismatch", 0)
    # the sandboxed episode gets the verdict the in-process one gets
    assert MultiTurnVerifier().verify(flat).details == verdict_of(task, [list(task.gold.calls), [], []]).details


def test_single_turn_tasks_have_no_multi_turn_verdict(env):
    task = bank_task(user_turns=[], gold=Gold(calls=[c("deposit", account="bob", amount=5)]))
    result = CompositeReward().score(play(env, env.reset(task), [calls_text(*task.gold.calls), "Done."]).episode())
    names = {v.name: v.passed for v in result.verdicts}
    assert result.success and names["end_state"] is True and "multi_turn" not in names


# ---------------------------------------------------------------- BFCL parity (bfcl-eval)


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_verdicts_agree_with_bfcls_multi_turn_checker(capsys):
    """Every 4th task of each multi-turn category: the gold and 7 perturbations, our verdict vs
    BFCL's own multi_turn_checker (the full set: `python -m dataengine.external.bfcl.parity`)."""
    from dataengine.external.bfcl import MULTI_TURN_CATEGORIES
    from dataengine.external.bfcl.parity import KINDS, agreement

    results = [agreement(category, every=4) for category in MULTI_TURN_CATEGORIES]
    checked, agree = sum(r["checked"] for r in results), sum(r["agree"] for r in results)
    bfcl_valid = {k: sum(r["by_kind"].get(k, [0, 0, 0])[2] for r in results) for k in KINDS}
    with capsys.disabled():
        print(f"\nBFCL multi-turn parity: {agree}/{checked} agree over {sum(r['tasks'] for r in results)} tasks; "
              f"BFCL valid per kind {bfcl_valid}")
    assert [d for r in results for d in r["disagreements"]] == []
    assert agree == checked and checked > 1500
    # the perturbations are not all failures: BFCL accepts some (a repeated call, a read moved earlier)
    assert bfcl_valid["gold"] == sum(r["tasks"] for r in results) and bfcl_valid["extra_call"] > 0
    assert bfcl_valid["drop_last"] == 0 and bfcl_valid["empty_turn"] == 0


def _cli(*args: str):
    from typer.testing import CliRunner

    from dataengine.cli import app

    return CliRunner().invoke(app, ["verify", "bfcl", *args])


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_cli_verify_bfcl_judges_multi_turn_predictions_per_turn(tmp_path):
    from dataengine.external import bfcl

    tasks = bfcl.load_tasks("multi_turn_miss_func", limit=3)
    gold = [bfcl.gold_prediction(t) for t in tasks]
    emptied = {**gold[1], "turns": [turn if i != 0 else [] for i, turn in enumerate(gold[1]["turns"])]}
    flat = {"id": gold[2]["id"], "calls": [call for turn in gold[2]["turns"] for call in turn]}
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps(p) + "\n" for p in [gold[0], emptied, flat]))
    out = tmp_path / "r.jsonl"
    result = _cli("--category", "multi_turn_miss_func", "--predictions", str(preds), "--out", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()][:3]
    assert [r["valid"] for r in rows] == [True, False, False]
    assert rows[1]["reason"].startswith("empty_turn: no tool call in turn 0")
    assert rows[2]["reason"] == f"expected {tasks[2].num_turns} turns of calls, got 1"


class GoldTurnsPolicy(Policy):
    """A test double of the model that plays the gold of a multi-turn task: in each user turn,
    all of the turn's gold calls in one reply, then "Done."."""

    model_id = "gold-turns@0"

    def __init__(self, task: Task) -> None:
        self.task = task
        self.stats = PolicyStats()

    def text(self, messages: Sequence[Message]) -> str:
        first = sum(m.role == "user" for m in self.task.messages)
        turn = sum(m.role == "user" for m in messages) - first
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        acted = any(m.role == "assistant" for m in messages[last_user:])
        calls = self.task.gold.turn_calls[turn]
        return "Done." if acted or not calls else render_tool_calls(list(calls))

    def sample(self, convs, k, **kwargs):
        self.stats.calls += 1
        self.stats.generated_tokens += 2 * k * len(convs)
        return [[Sample(self.text(conv.messages), (1, 2), (-0.5, -0.5), -1.0, 2, "stop")] * k for conv in convs]

    def score(self, convs, continuations, *, end_turn=True):
        raise NotImplementedError("samples only")


def _search_and_store(tmp_path, task: Task, policy, sims: int, max_new_tokens: int = 8):
    from dataengine.config import load_config
    from dataengine.search.run import run_shard, write_shard
    from dataengine.stages import make_reward
    from storage import Store

    cfg = load_config(None, policy__model="tiny", policy__device="cpu", policy__max_new_tokens=max_new_tokens,
                      search__num_simulations=sims, search__num_actions=2, search__value="zero", search__max_depth=12,
                      search__max_generated_tokens=100_000)
    with Sandbox(workers=1, timeout_s=30, cpu_s=30) as sandbox:
        env = ToolEnv(sandbox, max_steps=4)
        out = run_shard("s0", [task], method="mcts", policy=policy, env=env, reward=make_reward(cfg, env),
                        config=cfg, seed=0)
    store = Store(tmp_path / "store")
    write_shard(store, out, run_id="run-mt")
    return store.nodes().collect(), store.trajectories().collect()


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_search_on_a_bfcl_multi_turn_task_stores_the_turn_of_every_node(tmp_path):
    """MCTS with a gold-playing test double: the tree goes through every user turn, each node is
    stored with its turn, and the episode that plays every turn's gold succeeds."""
    from dataengine.external import bfcl

    task = next(t for t in bfcl.load_tasks("multi_turn_base") if t.num_turns == 2 and all(t.gold.turn_calls))
    nodes, trajs = _search_and_store(tmp_path, task, GoldTurnsPolicy(task), sims=6)
    assert sorted(set(nodes["turn"].to_list())) == [0, 1]
    by_depth = dict(zip(nodes["depth"].to_list(), nodes["turn"].to_list()))
    assert [by_depth[d] for d in range(5)] == [0, 0, 1, 1, 1]  # calls, Done (turn 1 starts), calls, Done
    solved = trajs.filter(trajs["success"])
    assert solved.height >= 1 and solved["turn"].to_list()[0] == 1


@pytest.mark.slow
@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_tiny_model_search_on_a_bfcl_multi_turn_task_stores_per_turn_nodes(tmp_path):
    """The real sampling path (tiny random model, 2 simulations): its replies carry no tool call,
    so each ends a user turn, and the stored nodes span more than one turn."""
    from dataengine.external import bfcl
    from dataengine.policy import make_policy

    task = bfcl.load_tasks("multi_turn_base", ids=["multi_turn_base_0"])[0]
    nodes, _ = _search_and_store(tmp_path, task, make_policy("hf", "tiny"), sims=2)
    turns = nodes["turn"].to_list()
    assert nodes.height > 1 and None not in turns and len(set(turns)) > 1


@pytest.mark.slow
@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_smollm2_search_on_a_bfcl_multi_turn_task_lands_in_the_store_per_turn(tmp_path):
    """SmolLM2 end to end on a BFCL multi-turn task: real sampling and tool execution in
    the sandbox, every node stored with its user turn, every ended episode verified per turn."""
    from dataengine.external import bfcl
    from dataengine.policy import make_policy

    task = bfcl.load_tasks("multi_turn_base", ids=["multi_turn_base_0"])[0]
    policy = make_policy("hf", "smollm2")
    nodes, trajs = _search_and_store(tmp_path, task, policy, sims=4, max_new_tokens=48)
    turns = nodes["turn"].to_list()
    assert nodes.height > 1 and None not in turns
    assert set(turns) <= set(range(task.num_turns))
    # (4 simulations rarely end an episode of this task; any that ended is judged per turn)
    assert trajs["success"].null_count() == 0
    for row in trajs["verdicts"].to_list():
        assert "multi_turn" in [v["name"] for v in row]
