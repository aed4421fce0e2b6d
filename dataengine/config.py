"""Run configuration: pydantic models that load from YAML or TOML.

One `EngineConfig` with a section per stage. Unknown keys are refused (a typo is an error, not
a silently ignored setting) and every error names the dotted path of the bad field and the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

M = TypeVar("M", bound=BaseModel)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SandboxConfig(Section):
    workers: int = Field(2, ge=1, description="worker processes executing tool calls")
    timeout_s: float = Field(5.0, gt=0, description="wall-clock limit per tool call")
    memory_mb: int = Field(1024, ge=64, description="address-space limit per worker")
    cpu_s: float = Field(10.0, gt=0, description="CPU-time limit per tool call")
    max_output_bytes: int = Field(65536, ge=256, description="largest JSON tool output kept")


class EnvConfig(Section):
    max_steps: int = Field(6, ge=1, description="assistant turns before an episode is truncated")


class PolicyConfig(Section):
    backend: Literal["hf", "vllm"] = Field("hf", description="generation backend")
    model: str = Field("smollm2", description="'smollm2', 'tiny' or a checkpoint folder")
    device: str = Field("auto", description="'auto' (cuda if present), 'cpu' or 'cuda'")
    max_new_tokens: int = Field(96, ge=1, description="tokens generated per action at most")
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    few_shot: bool = Field(True, description="include the worked examples in the system prompt")


class SearchConfig(Section):
    algorithm: Literal["puct", "uct", "gumbel"] = Field("puct", description="selection rule")
    num_simulations: int = Field(16, ge=1, description="simulations per tree")
    num_actions: int = Field(4, ge=1, description="K: candidate actions sampled per expansion")
    max_depth: int = Field(6, ge=1, description="deepest node searched (assistant turns)")
    leaves_per_iteration: int = Field(1, ge=1, description="L: leaves per tree per iteration")
    pb_c_init: float = Field(1.25, description="PUCT c1")
    pb_c_base: float = Field(19652.0, description="PUCT c2")
    dirichlet_alpha: float = Field(0.3, gt=0, description="root noise concentration")
    dirichlet_fraction: float = Field(0.25, ge=0, le=1, description="root noise weight")
    value: Literal["rollout", "critic", "value_model", "zero"] = Field(
        "rollout", description="value estimate for non-terminal leaves"
    )
    critic_mix: float = Field(
        1.0, ge=0, le=1, description="a in Q = a*Q_mcts + (1-a)*Q_critic (1 = no critic)"
    )
    process_reward_cap: float = Field(
        0.0, ge=0, le=0.5, description="cap of step-verifier shaping added to Q (0 = off)"
    )
    max_generated_tokens: int = Field(
        20000, ge=1, description="generation budget per task, summed over all model calls"
    )
    trees_per_batch: int = Field(8, ge=1, description="B: trees searched together")


class RewardConfig(Section):
    weights: dict[str, float] = Field(
        default_factory=dict, description="verifier name -> weight; empty = documented defaults"
    )


class DeriveConfig(Section):
    margin: float = Field(0.2, ge=0, description="theta: least value gap for a step pair")
    min_visits: int = Field(1, ge=0, description="least visits of both actions of a step pair")
    sft_per_task: int = Field(2, ge=1, description="k: successful trajectories kept per task")
    replay_low: float = Field(0.0, ge=0, le=1, description="GRPO replay: p_success above this")
    replay_high: float = Field(1.0, ge=0, le=1, description="GRPO replay: p_success below this")


class EngineConfig(Section):
    """The whole run: which tasks, which model, how to search, where to store."""

    store: str = Field("runs/store", description="store root folder")
    seed: int = Field(0, description="seed of task generation, sampling and search")
    suites: list[str] = Field(default_factory=lambda: ["arithmetic"], description="suite names")
    num_tasks: int = Field(8, ge=1, description="tasks per suite")
    split: Literal["train", "heldout"] = Field("train", description="which split to search")
    shard_size: int = Field(4, ge=1, description="tasks per shard (unit of commit and retry)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    derive: DeriveConfig = Field(default_factory=DeriveConfig)


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; names the file and the field."""


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) file into a dict."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"config file {path}: unknown suffix {path.suffix!r}; use .yaml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:].upper()}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate `data` as `model`; a failure lists each bad field by dotted path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            problems.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"{source} has {len(problems)} bad field(s):\n" + "\n".join(problems)) from None


def load_config(path: str | Path | None = None, model: type[M] = EngineConfig, **overrides: Any) -> M:
    """Load a config file (or the defaults when `path` is None), then apply dotted overrides.

    `overrides` use `__` for nesting: load_config(p, search__num_simulations=32).
    """
    data = read_mapping(path) if path is not None else {}
    for key, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate(model, data, source=f"config file {path}" if path else "config")
