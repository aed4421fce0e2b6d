"""A small bank: three tools over one account table, the tool state.

Loaded with `--tools bank_tools.py` (or config `tools.modules`); the file's plain functions
become the toolbox named by TOOLBOX. The state is a JSON dict {"accounts": {name: balance}}: the
environment copies it into the sandbox worker for each call and keeps the mutated copy, so
search branches never share it.
"""

from __future__ import annotations

TOOLBOX = "bank"
# The state at reset of a task that gives no initial_state of its own.
INITIAL_STATE = {"accounts": {"alice": 120, "bob": 45, "carol": 300, "dave": 10}}
# Stateful tools that only read: the sandbox does not send the state back after them.
READ_ONLY = ("get_balance",)
# Worked examples the model is shown before each task, as chat turns: the request, the calls
# (their outputs come from replaying them through these tools on INITIAL_STATE) and the reply.
# None of them is a task of tasks.jsonl (`dataengine tasks validate` refuses a task that is).
EXAMPLES = [
    {"user": "Deposit 70 dollars into Carol's account.",
     "calls": [{"name": "deposit", "arguments": {"account": "carol", "amount": 70}}],
     "answer": "Done. Carol's balance is now 370 dollars."},
    {"user": "Transfer 25 dollars from Carol to Bob.",
     "calls": [{"name": "transfer", "arguments": {"source": "carol", "target": "bob", "amount": 25}}],
     "answer": "Done. Carol has 275 dollars and Bob has 70 dollars."},
]


def _account(state: dict, name: str) -> str:
    key = name.strip().lower()
    if key not in state["accounts"]:
        raise ValueError(f"no account named {name!r}; accounts: {', '.join(sorted(state['accounts']))}")
    return key


def _amount(amount: int) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ValueError(f"amount must be a positive whole number of dollars, got {amount!r}")
    return amount


def get_balance(state: dict, account: str) -> dict:
    """Get the balance of an account.

    Args:
        account: The account holder's first name, like "alice".
    """
    key = _account(state, account)
    return {"account": key, "balance": state["accounts"][key]}


def deposit(state: dict, account: str, amount: int) -> dict:
    """Deposit money into an account.

    Args:
        account: The account holder's first name, like "alice".
        amount: Dollars to deposit (a positive whole number).
    """
    key = _account(state, account)
    state["accounts"][key] += _amount(amount)
    return {"account": key, "balance": state["accounts"][key]}


def transfer(state: dict, source: str, target: str, amount: int) -> dict:
    """Move money from one account to another.

    Args:
        source: The first name of the account the money leaves.
        target: The first name of the account the money goes to.
        amount: Dollars to move (a positive whole number, at most the source's balance).
    """
    src, dst = _account(state, source), _account(state, target)
    if src == dst:
        raise ValueError("source and target are the same account")
    amount = _amount(amount)
    if state["accounts"][src] < amount:
        raise ValueError(f"{src} has {state['accounts'][src]} dollars, less than {amount}")
    state["accounts"][src] -= amount
    state["accounts"][dst] += amount
    return {"source": {"account": src, "balance": state["accounts"][src]},
            "target": {"account": dst, "balance": state["accounts"][dst]}}
