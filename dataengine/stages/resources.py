"""What a stage works with, built once from the config: the policy, the sandboxed ToolEnv, the
composite reward and the store.

`Resources.open(config, toolboxes)` builds them (the policy lazily: derive and rescore never
load a model) and closes the sandbox it started on exit. `shared_resources` keeps one policy
and one sandbox per process, so every shard a flow worker runs reuses them (one backend per
worker, as on a GPU). The CLI and the flows both go through these two, never around them.
"""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dataengine import heap
from dataengine.config import EngineConfig


def make_reward(config: EngineConfig, env: Any) -> Any:
    """The composite reward of config.reward (empty weights: the documented defaults); env None:
    no replay (enough for its verifier versions, not for scoring tau2 end states)."""
    from dataengine.verifiers.composite import CompositeReward, RewardWeights

    weights = RewardWeights(shaping=dict(config.reward.weights)) if config.reward.weights else None
    return CompositeReward(weights=weights, replay=env.replay if env is not None else None)


def verifier_versions(config: EngineConfig) -> dict[str, str]:
    """Verifier name -> version of config.reward's composite reward, without a sandbox: what a
    run's lineage row records before its shards run."""
    return make_reward(config, None).versions()


def make_sandbox(config: EngineConfig, toolboxes: Sequence[str]) -> Any:
    """A Sandbox with config.sandbox's limits, `toolboxes` preloaded in its workers, which
    import config.tools.modules (loaded here first, so a bad entry fails before any worker)."""
    from dataengine.tools.registry import load_tools
    from dataengine.tools.sandbox import Sandbox

    load_tools(config.tools.modules)
    served = set()
    if config.tools.mcp:  # MCP servers' toolboxes run in this process, not in the workers
        from dataengine.tools.mcp import register_servers

        served = set(register_servers(config.tools.mcp, config.sandbox))
    return Sandbox.from_config(config.sandbox, preload=sorted(set(toolboxes) - served), modules=config.tools.modules)


def open_store(path: Any, *, create: bool = True) -> Any:
    """A storage.Store at `path` (a Store passes through)."""
    from storage import Store

    return path if isinstance(path, Store) else Store(path, create=create)


@dataclass
class Resources:
    """The policy, env, reward and store of one config.

    policy: built on first use from config.policy (or given); env: a ToolEnv over a sandbox
    with config.sandbox's limits; reward: config.reward's composite reward over that env;
    store: config.store (or given). `close()` closes what `open` started.
    """

    config: EngineConfig
    env: Any
    reward: Any
    store: Any
    _policy: Any = None
    _value_model: Any = None
    _close: list[Any] = field(default_factory=list)

    @property
    def policy(self) -> Any:
        if self._policy is None:
            from dataengine.policy import policy_from_config

            self._policy = policy_from_config(self.config.policy, self.config.tools.modules)
        return self._policy

    @classmethod
    @contextmanager
    def open(cls, config: EngineConfig, toolboxes: Sequence[str], *, policy: Any = None, env: Any = None,
             store: Any = None) -> Iterator[Resources]:
        """Resources of `config` for tasks of `toolboxes`; given parts are used as they are."""
        from dataengine.env import ToolEnv

        closers = []
        if env is None:
            sandbox = make_sandbox(config, toolboxes)
            closers.append(sandbox)
            env = ToolEnv(sandbox, max_steps=config.env.max_steps)
        resources = cls(config, env, make_reward(config, env), open_store(config.store if store is None else store),
                        _policy=policy, _close=closers)
        try:
            yield resources
        finally:
            resources.close()

    @property
    def value_model(self) -> Any:
        """The value head of config.generate.value_model over the policy's model, or None; a
        head fitted for another model or tokenizer is refused by ValueModel.load."""
        path = self.config.generate.value_model
        if path is None:
            return None
        if self._value_model is None:
            from dataengine.values import ValueModel

            self._value_model = ValueModel(self.policy).load(path)
        return self._value_model

    def close(self) -> None:
        for item in self._close:
            item.close()
        self._close.clear()


# ---------------------------------------------------------------------------- one per process

_lock = threading.Lock()
_policies: dict[str, Any] = {}
_sandboxes: dict[str, Any] = {}


def shared_resources(config: EngineConfig, toolboxes: Sequence[str], *, policy: bool = True) -> Resources:
    """Resources whose policy and sandbox are kept for the life of the process (closed at exit):
    a flow worker loads its backend once and reuses it for every shard. A new policy section
    (a pipeline round's new checkpoint) replaces the last backend. policy=False: no model is
    loaded (rescore)."""
    from dataengine.env import ToolEnv
    from dataengine.policy import policy_from_config

    policy_key = "|".join([config.policy.model_dump_json(), *config.tools.modules])  # tools add example episodes
    sandbox_key = "|".join([config.sandbox.model_dump_json(), ",".join(sorted(set(toolboxes))),
                            *config.tools.modules])
    with _lock:
        if policy and policy_key not in _policies:
            _policies.clear()
            _policies[policy_key] = policy_from_config(config.policy, config.tools.modules)
        if sandbox_key not in _sandboxes:
            sandbox = make_sandbox(config, toolboxes)
            atexit.register(sandbox.close)
            _sandboxes[sandbox_key] = sandbox
        env = ToolEnv(_sandboxes[sandbox_key], max_steps=config.env.max_steps)
        model = _policies.get(policy_key)
    return Resources(config, env, make_reward(config, env), open_store(config.store), _policy=model)


def release_policies() -> None:
    """Drop the kept policies (their model weights and caches), keeping the sandboxes: a pipeline
    frees them before training, whose model, optimizer and gradients need the memory."""
    with _lock:
        _policies.clear()
    gc.collect()
    heap.trim()


def release_resources() -> None:
    """Drop the kept policies and close the kept sandboxes (tests, or after a pipeline)."""
    with _lock:
        for sandbox in _sandboxes.values():
            sandbox.close()
        _sandboxes.clear()
    release_policies()
