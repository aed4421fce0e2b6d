"""Built-in suites: determinism, sizes, disjoint splits, gold solutions that really solve the
tasks when the tools run, derived schemas, toolbox lookup by name, and tool errors."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataengine.parsing import parse_action
from dataengine.suites import SUITES, generate_suite, get_suite, gold_turns, list_suites
from dataengine.suites.base import format_number
from dataengine.suites.gold import replay
from dataengine.tools.registry import get_toolbox
from dataengine.types import stable_hash

NAMES = ["arithmetic", "units", "shop", "chains", "notool"]


@pytest.fixture(scope="module", params=NAMES)
def full(request):
    """The full-size set (1000 train + 200 held-out) of each suite, made once."""
    return request.param, generate_suite(request.param, n_train=1000, n_heldout=200, seed=0)


def test_list_suites():
    assert list_suites() == [*NAMES, "fncall"]  # fncall has its own tests (test_fncall.py)
    assert list(SUITES) == [*NAMES, "fncall"] and len(SUITES) == 6
    with pytest.raises(KeyError, match="unknown suite 'nope'; known suites: arithmetic"):
        generate_suite("nope", 1, 1)


def test_full_size_ids_and_splits(full):
    name, tasks = full
    assert len(tasks) == 1200
    train, heldout = tasks[:1000], tasks[1000:]
    assert {t.split for t in train} == {"train"} and {t.split for t in heldout} == {"heldout"}
    assert train[42].id == f"{name}-train-000042" and heldout[0].id == f"{name}-heldout-000000"
    assert len({t.id for t in tasks}) == 1200
    assert all(t.suite == name and t.toolbox == name for t in tasks)
    assert all(len(t.messages) == 1 and t.messages[0].role == "user" for t in tasks)


def test_full_size_disjoint_and_distinct(full):
    _, tasks = full
    questions = [t.messages[0].content for t in tasks]
    assert len(set(questions)) == len(questions)
    train_q = {t.messages[0].content for t in tasks if t.split == "train"}
    assert not train_q & {t.messages[0].content for t in tasks if t.split == "heldout"}


def test_full_size_gold_solves_every_task(full):
    """Executing the gold calls directly gives the gold answer and the gold end state."""
    name, tasks = full
    for task in tasks:
        outputs, end_state = replay(task.toolbox, task.gold.calls, task.initial_state)
        assert task.gold.needs_tool == bool(task.gold.calls)
        assert task.metadata["n_steps"] == len(task.gold.calls)
        if name == "shop":
            assert task.gold.end_state_hash == stable_hash(end_state)
            assert (task.gold.answer is None) == task.metadata["changes_state"]
            if task.gold.answer is not None:  # the answer is what the last gold call showed
                assert task.gold.answer == _shop_answer_shown(task.metadata["kind"], outputs[-1])
        elif name == "notool":
            assert outputs == [] and task.gold.answer
        else:
            assert task.gold.end_state_hash is None and task.initial_state is None
            last = outputs[-1]
            assert task.gold.answer == (format_number(last) if isinstance(last, (int, float)) else last)
        # Each call's arguments come from the question or from earlier outputs: calls chain.
        if name in ("arithmetic", "chains"):
            for prev_out, call in zip(outputs, task.gold.calls[1:]):
                assert prev_out in call.arguments.values()


def _shop_answer_shown(kind, last):
    if kind in ("order_status", "cancel_unless_shipped"):
        return last["status"]
    if kind == "order_total":
        return format_number(last["total"])
    if kind == "product_stock":
        return str(last["stock"])
    if kind == "order_count":
        return str(len(last))
    assert kind == "latest_status", kind
    return last[-1]["status"]


def test_shop_state_changes_are_real():
    tasks = generate_suite("shop", 300, 0, seed=0)
    changed = [t for t in tasks if t.metadata["changes_state"]]
    assert 0.3 * len(tasks) < len(changed) < 0.8 * len(tasks)
    for task in changed[:50]:
        assert task.gold.end_state_hash != stable_hash(task.initial_state)
    kinds = {t.metadata["kind"] for t in tasks}
    assert {"cancel", "place_order", "order_status", "cancel_unless_shipped"} <= kinds


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_tasks_other_seed_other_tasks(name):
    a = generate_suite(name, n_train=30, n_heldout=10, seed=3)
    b = generate_suite(name, n_train=30, n_heldout=10, seed=3)
    c = generate_suite(name, n_train=30, n_heldout=10, seed=4)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    questions_a = [t.messages[0].content for t in a]
    questions_c = [t.messages[0].content for t in c]
    assert sum(x != y for x, y in zip(questions_a, questions_c)) > 20


def test_same_tasks_in_a_fresh_process():
    """Seeding does not depend on PYTHONHASHSEED or import order."""
    code = (
        "from dataengine.suites import generate_suite; import json;"
        f"print(json.dumps([[t.model_dump(mode='json') for t in generate_suite(n, 5, 2, seed=9)] for n in {NAMES!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""})  # fmt: skip
    here = [[t.model_dump(mode="json") for t in generate_suite(n, 5, 2, seed=9)] for n in NAMES]
    assert json.loads(out.stdout) == here


def test_heldout_does_not_depend_on_train_size_and_train_grows():
    small = generate_suite("arithmetic", n_train=10, n_heldout=20, seed=1)
    big = generate_suite("arithmetic", n_train=200, n_heldout=20, seed=1)
    assert small[10:] == big[200:]
    assert small[:10] == big[:10]


def test_bad_sizes():
    with pytest.raises(ValueError, match="n_train must be a non-negative integer"):
        generate_suite("arithmetic", -1, 2)
    with pytest.raises(ValueError, match="made only .* distinct train tasks"):
        generate_suite("notool", n_train=50_000, n_heldout=0)


def test_metadata_and_tools():
    for name in NAMES:
        task = generate_suite(name, 1, 0, seed=0)[0]
        assert {"level", "difficulty", "n_steps", "seed"} <= set(task.metadata)
        if name != "chains":
            assert [s.name for s in task.tools] == list(get_toolbox(name).tools)


def test_chains_offers_the_path_tools_and_distractors():
    from dataengine.suites.chains import OFFERED_TOOLS

    order = list(get_toolbox("chains").tools)
    for task in generate_suite("chains", 50, 0, seed=0):
        offered = [s.name for s in task.tools]
        assert len(offered) == OFFERED_TOOLS and offered == [n for n in order if n in offered]
        assert {c.name for c in task.gold.calls} <= set(offered)
        assert all(s == get_toolbox("chains").tools[s.name].spec for s in task.tools)


def test_arithmetic_is_hard_and_exact():
    tasks = generate_suite("arithmetic", 300, 0, seed=2)
    assert {t.metadata["n_steps"] for t in tasks} == {1, 2, 3}
    assert {c.name for t in tasks for c in t.gold.calls} == {"add", "subtract", "multiply", "divide"}
    for t in tasks:
        assert re.fullmatch(r"\d+", t.gold.answer), t.gold.answer
        assert max(abs(v) for c in t.gold.calls for v in c.arguments.values()) >= 100
    assert len({t.metadata["template"] for t in tasks}) == 4


def test_chains_paths_follow_the_tool_graph():
    from dataengine.suites.chains import LINKS, tool_graph

    graph = tool_graph()
    assert set(graph.nodes) == set(get_toolbox("chains").tools)
    assert graph.has_edge("city_country", "country_currency")
    assert not graph.has_edge("country_capital", "city_country")  # trivial inverse removed
    for u, v in graph.edges:
        assert LINKS[u].output == LINKS[v].input
    tasks = generate_suite("chains", 300, 0, seed=0)
    assert {t.metadata["n_steps"] for t in tasks} == {2, 3, 4}
    for t in tasks:
        path = t.metadata["path"]
        assert path == [c.name for c in t.gold.calls]
        assert all(graph.has_edge(u, v) for u, v in itertools.pairwise(path))


def test_notool_kinds():
    tasks = generate_suite("notool", 400, 0, seed=0)
    assert all(not t.gold.needs_tool and t.gold.calls == [] for t in tasks)
    assert [s.name for s in tasks[0].tools] == ["add", "subtract", "multiply", "divide"]
    by_question = {t.messages[0].content: t.gold.answer for t in tasks}
    kinds = {t.metadata["kind"] for t in tasks}
    assert kinds == {"capital", "fact", "reply_word", "uppercase", "first_letter", "trivial_arithmetic"}
    for q, a in by_question.items():
        if q.startswith("What is the capital of France"):
            assert a == "Paris"
        m = re.fullmatch(r"What is (\d) \+ (\d)\?", q)
        if m:
            assert a == str(int(m[1]) + int(m[2]))


def test_schemas_are_derived_from_docstrings():
    add = get_toolbox("arithmetic").tools["add"].spec
    assert add.description == "Add two numbers."
    assert add.parameters["properties"]["a"] == {"type": "number", "description": "The first number."}
    assert add.parameters["required"] == ["a", "b"]
    convert = get_toolbox("units").tools["convert"].spec.parameters
    assert "fahrenheit" in convert["properties"]["from_unit"]["enum"]
    assert convert["required"] == ["value", "from_unit", "to_unit"]
    shop = get_toolbox("shop")
    for tool in shop.tools.values():
        assert tool.stateful and "state" not in tool.spec.parameters["properties"]
        assert tool.spec.description and all(p.get("description") for p in tool.spec.parameters["properties"].values())
    assert shop.tools["restock"].spec.parameters["properties"]["quantity"]["type"] == "integer"
    for name in NAMES:
        for tool in get_toolbox(name).tools.values():
            json.dumps(tool.spec.to_openai())  # JSON-able as HF/TRL `tools=` entries


def test_every_toolbox_loads_by_name_in_a_fresh_process_without_torch():
    code = (
        "import sys; from dataengine.tools.registry import get_toolbox;"
        f"print([len(get_toolbox(n).tools) for n in {NAMES!r}], 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[4, 1, 9, 14, 4] False"


def test_gold_turns_are_hermes_calls_then_the_answer():
    for name in NAMES:
        for task in generate_suite(name, 5, 0, seed=5):
            turns = gold_turns(task)
            assert len(turns) == len(task.gold.calls) + 1
            for text, call in zip(turns, task.gold.calls):
                assert text == "<tool_call>" + json.dumps(
                    {"name": call.name, "arguments": call.arguments}, sort_keys=True) + "</tool_call>"
                action = parse_action(text)
                assert action.parse_error is None and action.tool_calls == [call]
            final = parse_action(turns[-1])
            assert final.is_final
            if task.gold.answer is not None:
                assert turns[-1] == task.gold.answer
            else:
                assert turns[-1] == task.metadata["gold_reply"]


def test_tool_errors_are_clear():
    from dataengine.suites import arithmetic, chains, shop, units

    with pytest.raises(ZeroDivisionError, match="b must be non-zero"):
        arithmetic.divide(3, 0)
    with pytest.raises(ValueError, match="cannot convert length .* to mass"):
        units.convert(3, "meter", "gram")
    with pytest.raises(ValueError, match="unknown unit 'parsec'"):
        units.convert(3, "parsec", "meter")
    with pytest.raises(ValueError, match="below absolute zero"):
        units.convert(-500, "celsius", "kelvin")
    with pytest.raises(ValueError, match="unknown city 'Paris'"):
        chains.city_country("Paris")
    task = generate_suite("shop", 1, 0, seed=0)[0]
    db = task.initial_state
    shipped = [oid for oid, o in db["orders"].items() if o["status"] in ("shipped", "delivered")]
    state = json.loads(json.dumps(db))
    with pytest.raises(shop.ShopError, match="unknown order id '#W0'"):
        shop.get_order(state, "#W0")
    if shipped:
        with pytest.raises(shop.ShopError, match="cannot be cancelled: its status is"):
            shop.cancel_order(state, shipped[0])
    pid = next(iter(db["products"]))
    with pytest.raises(shop.ShopError, match="not enough stock"):
        shop.place_order(state, next(iter(db["customers"])), pid, db["products"][pid]["stock"] + 1)
    with pytest.raises(shop.ShopError, match="positive whole number"):
        shop.restock(state, pid, 2.5)
    assert state == db  # failed calls change nothing


def test_shop_read_only_tools_never_change_the_database():
    from dataengine.suites.shop import READ_ONLY

    box = get_toolbox("shop")
    assert {n for n, t in box.tools.items() if not t.writes_state} == set(READ_ONLY)
    for task in generate_suite("shop", 100, 0, seed=4):
        state = json.loads(json.dumps(task.initial_state))
        for call in task.gold.calls:
            out = box.tools[call.name].fn(state, **call.arguments)
            if call.name in READ_ONLY:
                assert state == task.initial_state
                _scribble(out)  # outputs are copies: changing them leaves the database alone
                assert state == task.initial_state


def _scribble(value):
    """Overwrite every leaf of a JSON-like value in place."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in list(items):
        if isinstance(child, (dict, list)):
            _scribble(child)
        else:
            value[key] = "scribbled"


def test_shop_tools_change_state_consistently():
    from dataengine.suites import shop

    db = generate_suite("shop", 1, 0, seed=1)[0].initial_state
    state = json.loads(json.dumps(db))
    cid, pid = next(iter(state["customers"])), max(state["products"], key=lambda p: state["products"][p]["stock"])
    stock = state["products"][pid]["stock"]
    order = shop.place_order(state, cid, pid, 1)
    assert state["products"][pid]["stock"] == stock - 1 and order["status"] == "pending"
    assert order["order_id"] in state["orders"] and order["address"] == state["customers"][cid]["address"]
    shop.cancel_order(state, order["order_id"])
    assert state["products"][pid]["stock"] == stock
    assert state["orders"][order["order_id"]]["status"] == "cancelled"


def test_units_conversions_known_values():
    from dataengine.suites.units import convert

    assert convert(1, "mile", "kilometer") == 1.60934
    assert convert(100, "celsius", "fahrenheit") == 212
    assert convert(32, "fahrenheit", "kelvin") == 273.15
    assert convert(2, "week", "hour") == 336
    assert convert(1, "us_gallon", "liter") == 3.78541
    assert convert(1, "pound", "ounce") == 16


def test_get_suite_description():
    for name in NAMES:
        suite = get_suite(name)
        assert suite.name == name and suite.description and suite.toolbox is get_toolbox(name)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**31), name=st.sampled_from(NAMES))
def test_any_seed_gives_solvable_disjoint_tasks(seed, name):
    tasks = generate_suite(name, n_train=8, n_heldout=4, seed=seed)
    assert len({t.messages[0].content for t in tasks}) == 12
    for task in tasks:
        outputs, end_state = replay(task.toolbox, task.gold.calls, task.initial_state)
        if task.gold.end_state_hash is not None:
            assert stable_hash(end_state) == task.gold.end_state_hash
        if task.gold.calls and task.gold.answer is not None and name != "shop":
            last = outputs[-1]
            assert task.gold.answer == (format_number(last) if isinstance(last, (int, float)) else last)


def test_shop_task_without_database_gets_the_default_one():
    from dataengine.suites.shop import default_database

    task = generate_suite("shop", 1, 0)[0].model_copy(update={"initial_state": None})
    state = get_toolbox("shop").initial_state(task)
    assert state == default_database() and state["orders"] and state["products"]
