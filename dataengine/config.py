"""Run configuration: pydantic models that load from YAML or TOML.

One `EngineConfig` with a section per stage; `RuntimeConfig` (where a flow's shards run) and
`PipelineConfig` (rounds of the stages: an `engine:` and a `runtime:` section plus the rounds'
settings) are the same tree, so a pipeline file validates here without importing the flows. Unknown keys are refused (a typo is an error, not
a silently ignored setting) and every error names the dotted path of the bad field and the file.
"""

from __future__ import annotations

import copy
import tomllib
from os import PathLike
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

M = TypeVar("M", bound=BaseModel)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SandboxConfig(Section):
    workers: int = Field(2, ge=1, description="worker processes executing tool calls")
    timeout_s: float = Field(5.0, gt=0, description="wall-clock limit per tool call")
    memory_mb: int = Field(1024, ge=64, description="memory a call may add: per process and for the worker's whole process group")
    cpu_s: float = Field(10.0, gt=0, description="CPU-time limit per tool call")
    max_output_bytes: int = Field(65536, ge=256, description="largest JSON tool output kept")
    scratch_mb: int = Field(64, ge=1, description="tmpfs behind each worker's /tmp and /dev/shm; largest file a tool may write")


class MCPServerConfig(Section):
    """One MCP server offered as a toolbox: tasks name it by `name`."""

    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="toolbox name the tasks use")
    command: list[str] | None = Field(None, description="stdio transport: the command line that starts the server")
    url: str | None = Field(None, description="streamable-HTTP transport: the server's URL")
    stateful: bool = Field(True, description="calls change server state (branches are isolated by replay or snapshots)")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: environment variables set for the server process")
    cwd: str | None = Field(None, description="stdio: working folder of the server process")
    snapshot_tool: str | None = Field(None, description="stateful: a tool of the server, called without arguments, "
                                      "whose output is the whole server state (then no replay is needed)")
    restore_tool: str | None = Field(None, description="stateful: a tool of the server that loads a snapshot_tool output")
    restore_argument: str = Field("snapshot", description="the argument of restore_tool that takes the snapshot")
    timeout_s: float | None = Field(None, gt=0, description="wall-clock limit per call (default: sandbox.timeout_s)")
    startup_timeout_s: float = Field(30.0, gt=0, description="seconds the server may take to start and answer initialize")
    sessions: int = Field(4, ge=1, description="sessions open at once (stateful replay: one per branch being stepped)")
    idle_sessions: int = Field(4, ge=0, description="stateful replay: sessions kept at a branch's end, so the "
                               "branch's next call needs no replay")

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command (stdio) or url (HTTP)")
        if self.command is not None and not self.command:
            raise ValueError(f"MCP server {self.name!r}: command is empty")
        if (self.snapshot_tool is None) != (self.restore_tool is None):
            raise ValueError(f"MCP server {self.name!r}: give both snapshot_tool and restore_tool, or neither")
        return self


class ToolsConfig(Section):
    """Tools from outside the package: Python modules or files, and MCP servers."""

    modules: list[str] = Field(
        default_factory=list,
        description="a .py file or an importable module per entry, imported in every sandbox worker; "
        "its type-hinted functions (or the Toolbox it registers) become a toolbox",
    )
    mcp: list[MCPServerConfig] = Field(default_factory=list, description="MCP servers offered as toolboxes")


class EnvConfig(Section):
    max_steps: int = Field(6, ge=1, description="assistant turns per user turn before the episode is truncated")


class PolicyConfig(Section):
    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf", description="generation backend: hf (transformers), vllm (in-process engine) or openai (a served model)"
    )
    model: str = Field("smollm2", description="'smollm2', 'tiny' or a checkpoint folder; for openai the served model name")
    base_url: list[str] = Field(
        default_factory=list,
        description="openai: the servers' base URLs (e.g. http://127.0.0.1:8000/v1); with several, each task's "
        "requests go to one of them, picked by a hash of its first turns",
    )
    tokenizer: str | None = Field(
        None, description="openai: local tokenizer folder that renders prompts ('smollm2', 'tiny' or a folder; default: model)"
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions",
        description="openai: completions (token prompts rendered with our chat template) or chat (the server's "
        "template; no forced prefixes, no scoring; see docs/served.md)",
    )
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the API key (unset: 'EMPTY')")
    timeout_s: float = Field(120.0, gt=0, description="openai: seconds per request before it is retried")
    max_retries: int = Field(3, ge=0, description="openai: retries per request (exponential backoff from 0.5 s)")
    concurrency: int = Field(8, ge=1, description="openai: requests in flight at most (one per state, n=K samples each)")

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_or_more_urls(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _served_needs_url(self) -> Self:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend 'openai' needs base_url (--base-url URL), e.g. http://127.0.0.1:8000/v1")
        return self
    device: str = Field("auto", description="'auto' (cuda if present), 'cpu' or 'cuda'")
    max_new_tokens: int = Field(48, ge=1, description="tokens generated per action at most")
    temperature: float = Field(0.7, ge=0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    few_shot: bool = Field(True, description="include the worked examples in the system prompt")


class SearchConfig(Section):
    algorithm: Literal["puct", "uct", "gumbel"] = Field("puct", description="selection rule")
    num_simulations: int = Field(16, ge=1, description="simulations per tree")
    num_actions: int = Field(2, ge=1, description="K: candidate actions sampled per expansion")
    max_depth: int = Field(6, ge=1, description="deepest node searched (assistant turns)")
    leaves_per_iteration: int = Field(1, ge=1, description="L: leaves per tree per iteration")
    min_leaves: int = Field(
        0, ge=0, description="with L > 1: new leaves per iteration across the batch to keep while trees finish, "
        "ceil(min_leaves / searching trees) per tree, 1 to L (0: L per tree always)",
    )
    pb_c_init: float = Field(1.25, description="PUCT c1")
    pb_c_base: float = Field(19652.0, description="PUCT c2")
    dirichlet_alpha: float = Field(0.3, gt=0, description="root noise concentration")
    dirichlet_fraction: float = Field(0.25, ge=0, le=1, description="root noise weight")
    value: Literal["rollout", "critic", "value_model", "zero", "reference"] = Field(
        "zero",
        description="value estimate for non-terminal leaves; 'reference' is oracle-assisted (progress along the "
        "task's reference calls, for labelled training tasks only)",
    )
    objective: Literal["composite", "success", "efficient_success"] = Field(
        "composite",
        description="what the tree backs up at an episode's end and what rollouts score: the composite reward "
        "(success plus capped shaping less the syntax penalty; rows store it either way), success alone (1 or 0), "
        "or efficient_success: success times 1 / (1 + steps beyond the task's reference + calls repeated from the "
        "step before), so a success with one repeated call is worth 1/3 of a clean one, and only a clean success "
        "solves a tree (solved_policy, widening). Under composite a wrong final answer earns up to 0.15 of shaping, "
        "more than an unexplored continuation's zero value, which pulls multi-call searches towards answering early",
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
    widening: bool = Field(
        True, description="progressive widening: sample new candidates at a node whose candidates are all expanded, none successful"
    )
    widen_c: float = Field(2.0, gt=0, description="c of the widening cap k(N) = ceil(c * N^alpha) candidates at a node of N visits")
    widen_alpha: float = Field(0.5, ge=0, le=1, description="alpha of the widening cap k(N) = ceil(c * N^alpha)")
    widen_tool_call: bool = Field(
        True,
        description="a widening round at a node whose candidates are all replies without a tool call (task with tools) "
        "samples after a forced '<tool_call>' tag, so the search tries acting where the policy only answers",
    )
    widen_tool_names: bool = Field(
        False,
        description="widening rounds at a node of a task with tools alternate with tool-name rounds: candidates "
        "sampled after a forced '<tool_call>{\"name\": \"T\", \"arguments\": ' for the offered tool T the policy "
        "finds likeliest among those no candidate of the node calls yet (the policy writes the arguments), so the "
        "search tries the real tools where the policy invents names or keeps calling the wrong one",
    )
    widen_arguments: bool | Literal["schema"] = Field(
        False,
        description="widening rounds at a node with tool-call candidates alternate with rounds that add argument "
        "variants: the candidate calls with one numeric argument replaced by a number the user or a tool showed, "
        "or with another offered tool taking the same arguments, scored by the policy, most likely first; "
        "'schema' adds edits the tool's schema offers: an enum value the conversation names (or the closest to "
        "one outside the enum), a missing required argument, two arguments exchanged "
        "(dataengine/search/variants.py)",
    )
    max_actions: int = Field(
        16, ge=1, description="K_max: action slots per node when widening (never fewer than num_actions)"
    )
    transpositions: bool = Field(
        True, description="a node whose state equals an earlier node of its tree reuses that node's value estimate"
    )
    greedy_candidate: bool = Field(
        True,
        description="the first of a node's K candidates is the policy's greedy continuation (temperature 0), "
        "the other K - 1 are sampled: every tree holds the greedy path",
    )
    solved_policy: Literal["stop", "continue"] = Field(
        "continue",
        description="a tree with a verified success: stop (its unspent tokens go to the batch's unsolved trees) or continue",
    )
    solved_contrast: bool = Field(
        False,
        description="a solved tree sets siblings against its first success's path for step pairs: the path's "
        "unexpanded final-answer candidates are stepped and verified at once (contrast probes, no tokens, terminal "
        "nodes outside the tensor tree), and under solved_policy 'stop' the tree stops only once every node on the "
        "path with two or more candidates has a second child or probe (or its simulations or tokens run out)",
    )

    @property
    def action_slots(self) -> int:
        """K of the tensor tree: max(max_actions, num_actions) with widening, else num_actions."""
        return max(self.max_actions, self.num_actions) if self.widening else self.num_actions


class RewardConfig(Section):
    weights: dict[str, float] = Field(
        default_factory=dict, description="verifier name -> weight; empty = documented defaults"
    )


class DeriveConfig(Section):
    pair_rule: Literal["evidence", "margin"] = Field(
        "evidence", description="what makes a step pair: 'evidence', a verified success below the chosen action "
        "and none below the rejected one, or confidence bounds on their values that do not overlap (bound_c, "
        "bound_min_gap); 'margin', a value gap of at least `margin` (shaping alone can make one)")
    margin: float = Field(0.2, ge=0, description="theta: least value gap for a step pair under pair_rule 'margin'")
    min_visits: int = Field(1, ge=0, description="least visits of both actions of a step pair")
    bound_c: float = Field(
        1.0, ge=0, description="pair_rule 'evidence': half-width of an action's confidence interval on its value "
        "is bound_c / sqrt(visits); a bound pair needs the chosen's lower bound above the rejected's upper bound")
    bound_min_gap: float = Field(
        0.3, ge=0, description="pair_rule 'evidence': least value gap of a bound pair, above the composite reward's "
        "widest gap between two failures (shaping 0.15 over the syntax penalty's -0.1)")
    sft_per_task: int = Field(2, ge=1, description="k: successful trajectories kept per task")
    sft_fewest_steps: bool = Field(
        False, description="rejection-sampling SFT keeps only a task's successes with its fewest steps (no "
        "trajectory with a redundant call when a shorter success exists)")
    replay_low: float = Field(0.0, ge=0, le=1, description="GRPO replay: p_success above this")
    replay_high: float = Field(1.0, ge=0, le=1, description="GRPO replay: p_success below this")
    balance_by: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(,[A-Za-z_][A-Za-z0-9_]*)*$",
        description="the pipeline's exports: oversample rows so every value of this task metadata field "
        "(e.g. level) has as many as the most frequent one; comma-separated keys balance every combination, "
        "and the pair keys (pairs only) are 'decision', what the chosen reply does against the rejected one "
        "(call>answer, answer>call, ...), and 'depth', the tool results in the prompt; None: the rows as derived")
    balance_kinds: list[Literal["pairs", "sft", "replay"]] = Field(
        default_factory=lambda: ["pairs", "sft", "replay"],
        description="which exports balance_by applies to; the others keep the rows as derived (oversampling "
        "one level's pairs also multiplies whatever those pairs prefer)")
    decontaminate: bool = Field(
        True, description="derive and export refuse rows whose user question matches an eval-only item (BFCL, "
        "tau2, the built-in held-out splits: dataengine.derive.decontam) and count them per source")
    decontam_threshold: float = Field(
        0.85, ge=0, le=1, description="decontamination: least similarity of a near-duplicate question (n-gram "
        "cosine and word-sequence ratio, BFCL and tau2 items; 1: exact matches only)")


class GenerateConfig(Section):
    """How `generate` makes trees or episodes; every field changes the output, so every field
    is part of the run id."""

    method: Literal["mcts", "best_of_n", "greedy"] = Field(
        "mcts", description="tree search, or the sampling baselines best-of-N and greedy"
    )
    n: int | None = Field(None, ge=1, description="best_of_n: episodes per task (None: search.num_simulations)")
    prior: Literal["logprob", "frequency"] = Field(
        "logprob", description="edge priors: length-normalised log-probs, or sample frequency"
    )
    rollouts: int = Field(2, ge=1, description="Monte Carlo rollouts per leaf when search.value is 'rollout'")
    value_model: str | None = Field(
        None, description="fitted value head file (ValueModel.save) when search.value is 'value_model'"
    )


class EvalConfig(Section):
    """Held-out evaluation: greedy success, pass@k and search at inference.

    k: pass@k with k samples (0: no sampling); samples: n episodes per task for pass@k
    (default k; more samples lower the estimator's variance); temperature, top_p: sampling of
    the pass@k episodes (greedy is always temperature 0).
    """

    num_tasks: int = Field(20, ge=1, description="held-out tasks per suite")
    k: int = Field(0, ge=0, description="pass@k (0: no sampled episodes)")
    samples: int | None = Field(None, ge=1, description="episodes per task for pass@k (None: k)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of the pass@k episodes")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus mass of the pass@k episodes")
    max_new_tokens: int = Field(96, ge=1, description="tokens per assistant turn")
    seed: int = Field(0, description="seed of the held-out tasks and of sampling")
    greedy: bool = Field(True, description="run the greedy episodes (greedy_success and the axes)")
    search: bool = Field(False, description="also measure search-at-inference success")
    search_simulations: int = Field(8, ge=1, description="search at inference: simulations per tree")
    search_actions: int = Field(4, ge=1, description="search at inference: actions sampled per expansion")
    batch_size: int = Field(16, ge=1, description="tasks played together in one batch of episodes (bounds memory)")
    suites: list[str] | None = Field(
        None, description="suites evaluated (None: the engine's suites); eval-only sets such as bfcl:<category> go here")

    @field_validator("suites")
    @classmethod
    def _suite_names(cls, value: list[str] | None) -> list[str] | None:
        from dataengine.suites.catalog import check_suite_name

        return None if value is None else [check_suite_name(name) for name in value]

    @model_validator(mode="after")
    def _sampling(self) -> EvalConfig:
        if self.samples is not None and self.samples < max(1, self.k):
            raise ValueError(f"samples (n={self.samples}) must be >= k={self.k} for the pass@k estimator")
        if self.k and self.temperature <= 0:
            raise ValueError("pass@k needs sampling: temperature must be > 0")
        return self



# ---------------------------------------------------------------------------- training


class TrainConfig(Section):
    """Settings every trainer shares; DPOTrainConfig, SFTTrainConfig and GRPOTrainConfig extend
    it (dataengine.train maps them onto TRL's configs)."""

    init: str = Field("smollm2", description="model to start from: 'smollm2', 'tiny' or a checkpoint folder")
    out_dir: str = Field("checkpoints/run", description="folder the checkpoint is written to")
    learning_rate: float = Field(1e-5, gt=0, description="peak AdamW learning rate")
    num_train_epochs: float = Field(1.0, description="passes over the data (ignored if max_steps > 0)")
    max_steps: int = Field(-1, description="optimizer steps; > 0 overrides num_train_epochs")
    batch_size: int = Field(2, ge=1, description="examples per device per optimizer micro-step")
    gradient_accumulation_steps: int = Field(1, ge=1, description="micro-steps per optimizer step")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warmup")
    # The tool schemas and worked examples in the system turn take ~600 tokens of every prompt.
    max_length: int = Field(1024, ge=32, description="longest tokenized sequence; longer ones are truncated")
    lora: bool = Field(False, description="train LoRA adapters (peft) instead of all weights")
    lora_rank: int = Field(16, ge=1, description="LoRA rank r")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA path")
    seed: int = Field(0, description="seed of data order, dropout and sampling")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (saves memory)")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="'auto' (GPU when present), 'cpu' or 'cuda[:N]'")
    logging_steps: int = Field(1, ge=1, description="log metrics every this many steps")
    run_id: str | None = Field(None, description="run id for the store's models row")

    @field_validator("init", "out_dir", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, PathLike) else value

    @model_validator(mode="after")
    def _something_to_train(self) -> TrainConfig:
        if self.max_steps == 0 or (self.max_steps < 0 and self.num_train_epochs <= 0):
            raise ValueError("set max_steps > 0 or num_train_epochs > 0: nothing would be trained")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> Self:
        """A validated copy with `changes` (None values keep the current setting)."""
        return type(self).model_validate({**self.model_dump(), **{k: v for k, v in changes.items() if v is not None}})


class DPOTrainConfig(TrainConfig):
    """Settings of train_dpo (TRL DPOConfig underneath)."""

    learning_rate: float = Field(5e-6, gt=0, description="peak AdamW learning rate")
    beta: float = Field(0.1, gt=0, description="KL strength: higher keeps the policy closer to the reference")
    loss_type: str = Field("sigmoid", description="TRL DPO loss: sigmoid, ipo, hinge, robust, ... (comma-separate to mix)")
    behaviour_ref: bool = Field(
        False,
        description="reference = the behaviour model (the policy that sampled the pairs), scored once before training "
        "on exactly the tokens TRL compares; no reference model is kept during training",
    )
    behaviour_model: str | None = Field(
        None,
        description="with behaviour_ref: the model that sampled the pairs ('smollm2', 'tiny' or a folder); "
        "default: the one the store's nodes/trajectories record for the pairs' runs",
    )
    precompute_ref_log_probs: bool = Field(
        False, description="compute reference log-probs once before training (frees the reference model)"
    )


class SFTTrainConfig(TrainConfig):
    """Settings of train_sft (TRL SFTConfig underneath)."""

    learning_rate: float = Field(2e-5, gt=0, description="peak AdamW learning rate")
    assistant_only_loss: bool = Field(
        True, description="loss on assistant tokens only (prompts and tool outputs get label -100)"
    )
    packing: bool = Field(False, description="pack several examples into one max_length sequence")


class GRPOTrainConfig(TrainConfig):
    """Settings of train_grpo (TRL GRPOConfig underneath). batch_size counts completions, so it
    must be a multiple of num_generations."""

    learning_rate: float = Field(1e-6, gt=0, description="peak AdamW learning rate")
    batch_size: int = Field(4, ge=1, description="completions per device per micro-step")
    num_generations: int = Field(4, ge=2, description="rollouts per prompt (the GRPO group size; >= 2)")
    max_completion_length: int = Field(
        128, ge=8, description="token budget of a whole rollout (model and tool tokens together)"
    )
    max_tool_calls: int = Field(4, ge=1, description="tool-calling rounds per rollout")
    max_episode_steps: int = Field(8, ge=1, description="ToolEnv step budget per episode")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollouts")
    beta: float = Field(0.0, ge=0, description="KL penalty to the starting model (0: no reference model)")
    loss_type: str = Field("dapo", description="TRL GRPO loss: grpo, dapo, dr_grpo, bnpo, ...")
    scale_rewards: str = Field("group", description="advantage scaling: group, batch or none")
    mask_truncated_completions: bool = Field(False, description="leave rollouts cut by the token budget out of the loss")
    generation_kwargs: dict[str, Any] | None = Field(
        None, description="extra transformers GenerationConfig settings (top_k, repetition_penalty, ...)"
    )
    use_vllm: bool = Field(False, description="generate with vLLM (GPU; colocate mode)")
    sandbox_workers: int = Field(2, ge=1, description="sandbox worker processes executing tools")
    tool_timeout_s: float = Field(5.0, gt=0, description="wall-clock limit of one tool call")

    @model_validator(mode="after")
    def _groups_fit(self) -> GRPOTrainConfig:
        if (self.batch_size * self.gradient_accumulation_steps) % self.num_generations:
            raise ValueError(
                f"batch_size * gradient_accumulation_steps ({self.batch_size * self.gradient_accumulation_steps}) "
                f"must be a multiple of num_generations ({self.num_generations})"
            )
        return self


class TrainSection(Section):
    """Each trainer's settings (init, out_dir and run_id are set per stage by the caller)."""

    dpo: DPOTrainConfig = Field(default_factory=DPOTrainConfig)
    sft: SFTTrainConfig = Field(default_factory=SFTTrainConfig)
    grpo: GRPOTrainConfig = Field(default_factory=GRPOTrainConfig)

    def for_kind(self, kind: str) -> TrainConfig:
        if kind not in ("dpo", "sft", "grpo"):
            raise ValueError(f"unknown trainer {kind!r}; choose dpo, sft or grpo")
        return getattr(self, kind)


class EngineConfig(Section):
    """The whole run: which tasks, which model, how to search, where to store."""

    store: str = Field("runs/store", description="store root folder")
    seed: int = Field(0, description="seed of task generation, sampling and search")
    suites: list[str] = Field(default_factory=lambda: ["arithmetic"], description="suite names (dataengine.suites.catalog)")
    num_tasks: int = Field(8, ge=1, description="tasks per suite (with task_file: at most this many)")
    task_file: str | None = Field(None, description="a .jsonl/.parquet task file to search instead of the suites")
    levels: list[int] | None = Field(None, description="difficulty levels of the suites' tasks to search (None: all)")
    split: Literal["train", "heldout"] = Field("train", description="which split to search")
    shard_size: int = Field(4, ge=1, description="tasks per shard (unit of commit and retry)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    derive: DeriveConfig = Field(default_factory=DeriveConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    train: TrainSection = Field(default_factory=TrainSection)

    @field_validator("suites")
    @classmethod
    def _suite_names(cls, value: list[str]) -> list[str]:
        from dataengine.suites.catalog import check_suite_name

        return [check_suite_name(name) for name in value]

    # Sections and fields that cannot change what `generate` writes: left out of its run id.
    NOT_IN_RUN_ID: ClassVar[tuple[str, ...]] = ("store", "derive", "eval", "train", "sandbox.workers")
    # Where and how a served policy is reached changes no sample: a rerun against other URLs resumes.
    NOT_IN_RUN_ID += ("policy.base_url", "policy.api_key_env", "policy.timeout_s", "policy.max_retries", "policy.concurrency")

    def output_settings(self) -> dict[str, Any]:
        """The settings that change what `generate` writes (JSON), for its run id."""
        data = self.model_dump(mode="json")
        for dotted in self.NOT_IN_RUN_ID:
            *parents, leaf = dotted.split(".")
            node = data
            for part in parents:
                node = node[part]
            node.pop(leaf, None)
        return data


# ---------------------------------------------------------------------------- flows and pipelines

# The datasets derive writes (dataengine.derive.KINDS), named here so the pipeline's settings
# validate without importing the derivations.
DERIVED_KINDS = ("step-pairs", "trajectory-pairs", "sft", "recovery", "replay")


class RuntimeConfig(Section):
    """Where and how the shard tasks of a flow run (flows.runtime applies it)."""

    task_runner: Literal["thread", "ray"] = Field("thread", description="run shards in threads here, or on Ray")
    workers: int = Field(2, ge=1, description="threads of the thread runner")
    ray_address: str | None = Field(
        None, description="Ray cluster address ('auto', 'host:6379' of a head node, 'ray://host:10001'); None starts a local Ray"
    )
    ray_num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray instance (None: all)")
    gpus_per_shard: float = Field(0.0, ge=0, description="GPUs a shard task asks Ray for (one backend per GPU worker)")
    shard_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources a shard task asks for, e.g. {'worker': 1}: shards run only on nodes "
                    "started with --resources '{\"worker\": 1}'",
    )
    ray_spread: bool = Field(
        False, description="Ray's SPREAD scheduling: shard tasks go to the nodes in turn instead of filling the first node")
    ray_max_retries: int | None = Field(
        None, ge=0, description="Ray's reruns of a shard task whose worker process or node died (None: Ray's default, 3)")
    accelerator_slots: int = Field(1, ge=1, description="shard tasks using the model at the same time")
    retries: int = Field(2, ge=0, description="retries of a shard after a transient error")
    retry_delay_s: float = Field(2.0, ge=0, description="first retry delay; doubles each retry (jittered)")


class PipelineConfig(Section):
    """A whole self-improvement run: the engine config, rounds, trainers, evaluation size."""

    run_id: str = Field("pipeline", min_length=1, description="run id prefix of every run the pipeline writes")
    rounds: int = Field(1, ge=1, description="generate -> derive -> train -> evaluate rounds")
    trainers: list[Literal["dpo", "sft", "grpo"]] = Field(
        default_factory=lambda: ["dpo"], description="trainers run in order each round, each from the last checkpoint"
    )
    derive: list[Literal["step-pairs", "trajectory-pairs", "sft", "recovery", "replay"]] = Field(
        default_factory=lambda: list(DERIVED_KINDS), description="datasets derived from each round's trees"
    )
    out_dir: str = Field("runs/pipeline", description="folder for exported datasets and checkpoints")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="every stage's settings: generate (method), search, policy, derive, train (per trainer), eval",
    )
    curriculum: list[list[int]] = Field(
        default_factory=list,
        description="task levels searched per round, e.g. [[1], [1, 2], [1, 2, 3]] (the last entry repeats; "
                    "empty: engine.levels every round)",
    )
    round_settings: dict[int, dict[str, Any]] = Field(
        default_factory=dict,
        description="engine settings that change from a round on: {2: {'search.objective': 'efficient_success'}} "
                    "(dotted paths under engine; an entry holds for its round and every later one)",
    )
    round_trainers: dict[int, list[Literal["dpo", "sft", "grpo"]]] = Field(
        default_factory=dict,
        description="trainers that change from a round on: {2: ['sft']} (an entry holds for its round and every "
                    "later one; earlier rounds run `trainers`)",
    )
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @field_validator("round_trainers")
    @classmethod
    def _trainer_rounds(cls, value: dict[int, list[str]]) -> dict[int, list[str]]:
        for r, kinds in value.items():
            if r < 1:
                raise ValueError(f"round_trainers: rounds count from 1, not {r}")
            if not kinds:
                raise ValueError(f"round_trainers[{r}]: name at least one trainer (a round without training "
                                 "evaluates the same model again)")
        return value

    @field_validator("round_settings", mode="before")
    @classmethod
    def _dotted(cls, value: Any) -> Any:
        # A config file may nest them ({2: {search: {objective: ...}}}): one dotted path per leaf.
        def flat(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, leaf in node.items():
                out.update(flat(leaf, f"{prefix}{key}.") if isinstance(leaf, dict) else {f"{prefix}{key}": leaf})
            return out

        if isinstance(value, dict):
            return {r: flat(s) if isinstance(s, dict) else s for r, s in value.items()}
        return value

    @field_validator("round_settings")
    @classmethod
    def _rounds_and_keys(cls, value: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        for r, settings in value.items():
            if r < 1:
                raise ValueError(f"round_settings: rounds count from 1, not {r}")
            fixed = sorted(set(settings) & FIXED_ACROSS_ROUNDS)
            if fixed:
                raise ValueError(f"round_settings: {fixed[0]!r} cannot change between rounds (the pipeline sets it)")
        return value

    @model_validator(mode="after")
    def _round_settings_validate(self) -> PipelineConfig:
        for r in self.round_settings:
            round_engine(self, r)
        return self


# Settings the pipeline itself sets per round (the store it writes, the checkpoint it searches
# with, the seed it derives from engine.seed), so round_settings may not name them.
FIXED_ACROSS_ROUNDS = frozenset({"store", "seed", "policy.model", "levels"})


def round_engine(config: PipelineConfig, r: int) -> EngineConfig:
    """The engine settings of round `r`: config.engine with every round_settings entry of
    rounds 1..r applied in round order (round 0, the base model's evaluation, uses the engine's).
    ValueError naming the path when one is not an engine setting or its value does not validate."""
    data = config.engine.model_dump()
    for start in sorted(k for k in config.round_settings if k <= r):
        for dotted, value in config.round_settings[start].items():
            *parents, leaf = dotted.split(".")
            node: Any = data
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or leaf not in node:
                raise ValueError(f"round_settings[{start}]: engine has no setting {dotted!r}")
            node[leaf] = value
    try:
        return EngineConfig.model_validate(data)
    except ValueError as exc:
        raise ValueError(f"round_settings of rounds <= {r}: {exc}") from None


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


def validate(model: type[M], data: dict[str, Any], source: str = "config", *, allow_missing: bool = False) -> M | None:
    """Validate `data` as `model`; a failure lists each bad field by dotted path.

    allow_missing: required fields absent from `data` are not an error (a partial mapping an
    override completes); returns None when that is the only problem.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if allow_missing and err["type"] == "missing":
                continue
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            problems.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
        if not problems:
            return None
        raise ConfigError(f"{source} has {len(problems)} bad field(s):\n" + "\n".join(problems)) from None


def load_config(path: str | Path | None = None, model: type[M] = EngineConfig, **overrides: Any) -> M:
    """Load a config file (or the defaults when `path` is None), then apply dotted overrides.

    `overrides` use `__` for nesting: load_config(p, search__num_simulations=32). The file is
    validated whole first, so a bad field is reported even where an override replaces it.
    """
    data = read_mapping(path) if path is not None else {}
    if path is not None:
        validate(model, copy.deepcopy(data), source=f"config file {path}", allow_missing=True)
    for key, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate(model, data, source=f"config file {path}" if path else "config")  # type: ignore[return-value]
