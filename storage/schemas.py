"""Arrow schemas of every store table, with one docstring line per column.

Each table is a `TableSpec`: its columns are named once here, and the pyarrow schema, the
required-column check in `Store.append` and docs/store.md all come from these specs.

Conventions:
- Every table has `run_id` and `shard_id` (non-null): an append is one transaction keyed by
  (run_id, shard_id), so writing the same shard twice leaves one copy.
- Heterogeneous JSON (tool arguments, configs, task JSON, verdict details) is stored as
  canonical JSON strings in `*_json` string columns, because Arrow needs fixed schemas.
- Verdicts are a list of `VERDICT` structs, one per verifier.
- Timestamps are microseconds, UTC.

Bump `SCHEMA_VERSION` on any incompatible change; a store written by a newer version is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1

TIMESTAMP = pa.timestamp("us", tz="UTC")

VERDICT = pa.struct(
    [
        pa.field("name", pa.string()),
        pa.field("version", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("passed", pa.bool_()),
        pa.field("confidence", pa.float64()),
        pa.field("details_json", pa.string()),
    ]
)
"""One verifier's verdict: name, version, score, passed (null: does not apply), confidence,
details_json (JSON object)."""

VERDICTS = pa.list_(VERDICT)


@dataclass(frozen=True)
class Column:
    """One column: name, Arrow type, whether nulls are allowed, and what it holds."""

    name: str
    type: pa.DataType
    nullable: bool
    doc: str

    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)


@dataclass(frozen=True)
class TableSpec:
    """One store table: its name, what a row is, and its columns in order."""

    name: str
    row: str
    columns: tuple[Column, ...]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([c.field() for c in self.columns])

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def required(self) -> list[str]:
        return [c.name for c in self.columns if not c.nullable]

    def doc(self) -> str:
        """Markdown description: the row, then one line per column."""
        lines = [f"### {self.name}", "", f"One row per {self.row}.", ""]
        lines.append("| column | type | null | meaning |")
        lines.append("|---|---|---|---|")
        for c in self.columns:
            doc = c.doc.replace("|", "\\|")
            lines.append(f"| {c.name} | {c.type} | {'yes' if c.nullable else 'no'} | {doc} |")
        return "\n".join(lines)


def _c(name: str, type_: pa.DataType, doc: str, *, nullable: bool = True) -> Column:
    return Column(name, type_, nullable, doc)


_S, _I, _F, _B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

_KEY = (
    _c("run_id", _S, "the run that wrote the row (runs.run_id)", nullable=False),
    _c("shard_id", _S, "the shard of the run; (run_id, shard_id) is one transaction", nullable=False),
)
_SOURCE_VERSIONS = _c(
    "source_versions_json",
    _S,
    'JSON {table: Delta version} of the tables this row was derived from (time travel rebuilds it)',
)
_TOOLS = _c("tools_json", _S, "JSON list of the tools shown to the model, OpenAI form")

RUNS = TableSpec(
    "runs",
    "run of any flow (generate, export, train, eval); the lineage record",
    (
        *_KEY,
        _c("kind", _S, "generate | rescore | export | train_dpo | train_sft | train_grpo | evaluate | ..."),
        _c("config_json", _S, "JSON of the full config the run used"),
        _c("code_version", _S, "git sha of the code (suffix -dirty when the tree had changes)"),
        _c("model_id", _S, "model the run used (models.model_id)"),
        _c("checkpoint_hash", _S, "hash of the checkpoint weights"),
        _c("verifier_versions_json", _S, "JSON {verifier name: version}"),
        _c("seed", _I, "random seed"),
        _SOURCE_VERSIONS,
        _c("created_at", TIMESTAMP, "when the row was written (filled by the store when null)"),
    ),
)

TASKS = TableSpec(
    "tasks",
    "task a run worked on",
    (
        *_KEY,
        _c("task_id", _S, "Task.id", nullable=False),
        _c("suite", _S, "Task.suite"),
        _c("split", _S, "train | heldout"),
        _c("task_json", _S, "the whole Task as JSON (rebuilds it with Task.model_validate_json)"),
        # Added after v1 (compatible: rows written before read these as null).
        _c("generated_tokens", _I, "generate runs: tokens the search or sampling generated for the task (its budget used; null elsewhere)"),
    ),
)

NODES = TableSpec(
    "nodes",
    "node of a search tree; the edge into it is the action that produced it",
    (
        *_KEY,
        _c("task_id", _S, "task the tree searched", nullable=False),
        _c("suite", _S, "suite of the task"),
        _c("tree_id", _S, "tree id, unique within the run", nullable=False),
        _c("node_id", _I, "node index within its tree (root is 0)", nullable=False),
        _c("parent_id", _I, "parent node_id; null for the root"),
        _c("depth", _I, "number of actions from the root (root is 0)"),
        _c("action_index", _I, "edge index of this node at its parent (0..K-1); null for the root"),
        _c("action_text", _S, "raw model text of the action into this node"),
        _c("action_json", _S, "the parsed Action as JSON"),
        _c("action_key", _S, "Action.key(): equal keys are the same action"),
        _c("parse_error", _S, "parse error of the action text; null when it parsed"),
        _c("logprob", _F, "behaviour log-probability of the action tokens, summed"),
        _c("num_tokens", _I, "generated tokens of the action"),
        _c("prior", _F, "prior probability of the edge at the parent"),
        _c("visits", _I, "visit count N"),
        _c("q", _F, "mean backed-up value Q"),
        _c("value_estimate", _F, "leaf value estimate (value model, rollouts or mix)"),
        _c("critic_score", _F, "AI critic score of the action"),
        _c("reward", _F, "immediate reward of the edge into this node"),
        _c("terminal", _B, "the episode ended at this node"),
        _c("success", _B, "terminal and solved; null when not terminal or unknown"),
        _c("verdicts", VERDICTS, "verifier verdicts at this node"),
        _c("observation", _S, "text of the observations (tool results) the action produced"),
        _c("messages_json", _S, "JSON list of message dicts up to and including this node"),
        _c("env_hash", _S, "stable hash of the env snapshot after the action"),
        _c("prefix_hash", _S, "stable hash of the conversation prefix"),
        _c("model_id", _S, "policy model that produced the action"),
        _c("created_at", TIMESTAMP, "when the row was written (filled by the store when null)"),
        # Added after v1 (compatible: rows written before read these as null).
        _c("origin", _S, "what produced the node: root | greedy (the parent's greedy candidate) | expand (the parent's first K samples) | widen (a widening round) | widen_tool (a tool-call widening round) | widen_args (an argument variant a widening round added) | contrast (a solved tree's verified final-answer candidate outside the tensor tree, search.solved_contrast)"),
        _c("widen_round", _I, "widening round at the parent that added the edge into this node (0: first K samples); null for the root"),
        _c("transposition_of", _I, "node_id of the earlier node of the tree with an equal state, whose value estimate this node reused"),
        _c("budget_received", _I, "root row only: generated tokens the tree received from solved trees of its batch"),
        _c("budget_given", _I, "root row only: generated tokens the tree gave to the unsolved trees of its batch once solved"),
        _c("turn", _I, "user turn (0-based) the conversation is in at this node: a reply that ends a turn of a multi-turn task moves its node to the next turn"),
    ),
)

TRAJECTORIES = TableSpec(
    "trajectories",
    "whole episode (a root-to-leaf path or a sampled rollout)",
    (
        *_KEY,
        _c("task_id", _S, "task of the episode", nullable=False),
        _c("suite", _S, "suite of the task"),
        _c("split", _S, "train | heldout"),
        _c("tree_id", _S, "tree it was read from; null when not from a tree"),
        _c("traj_id", _S, "trajectory id, unique within the run", nullable=False),
        _c("node_ids", pa.list_(_I), "node_ids of the path in the tree, root first"),
        _c("source", _S, "mcts | best_of_n | greedy | eval | ..."),
        _c("messages_json", _S, "JSON list of message dicts of the whole episode"),
        _c("final_answer", _S, "final answer text; null when none"),
        _c("reward", _F, "composite verifier reward of the episode"),
        _c("success", _B, "solved according to the verifiers"),
        _c("num_steps", _I, "assistant turns"),
        _c("num_tool_calls", _I, "tool calls made"),
        _c("num_generated_tokens", _I, "tokens generated by the policy"),
        _c("verdicts", VERDICTS, "verifier verdicts of the episode"),
        _c("model_id", _S, "policy model"),
        _c("traj_hash", _S, "hash of the normalised trajectory (exact dedup key)"),
        # Added after v1 (compatible: rows written before read these as null).
        _c("turn", _I, "user turn (0-based) the episode ended in; the task's last turn when it played every turn"),
    ),
)

PAIRS = TableSpec(
    "pairs",
    "preference pair (step-level from siblings, or trajectory-level)",
    (
        *_KEY,
        _c("pair_id", _S, "pair id, unique within the run", nullable=False),
        _c("kind", _S, "step | trajectory"),
        _c("task_id", _S, "task of the pair", nullable=False),
        _c("suite", _S, "suite of the task"),
        _c("prompt_json", _S, "JSON list of message dicts shared by both answers"),
        _c("chosen_json", _S, "JSON list of message dicts of the chosen continuation"),
        _c("rejected_json", _S, "JSON list of message dicts of the rejected continuation"),
        _TOOLS,
        _c("margin", _F, "chosen_value - rejected_value"),
        _c("chosen_value", _F, "value (Q or reward) of the chosen side"),
        _c("rejected_value", _F, "value of the rejected side"),
        _c("chosen_visits", _I, "visits of the chosen node"),
        _c("rejected_visits", _I, "visits of the rejected node"),
        _c("chosen_logprob", _F, "behaviour log-prob of the chosen side (reference option)"),
        _c("rejected_logprob", _F, "behaviour log-prob of the rejected side"),
        _c("node_id", _I, "parent node of the siblings (step pairs)"),
        _c("tree_id", _S, "tree the pair came from"),
        _SOURCE_VERSIONS,
    ),
)

SFT = TableSpec(
    "sft",
    "supervised example (rejection sampling or recovery)",
    (
        *_KEY,
        _c("example_id", _S, "example id, unique within the run", nullable=False),
        _c("kind", _S, "rs | recovery"),
        _c("task_id", _S, "task of the example", nullable=False),
        _c("suite", _S, "suite of the task"),
        _c("messages_json", _S, "JSON list of message dicts"),
        _TOOLS,
        _c("score", _F, "verifier score of the example"),
        _c("num_steps", _I, "assistant turns"),
        _SOURCE_VERSIONS,
    ),
)

REPLAY = TableSpec(
    "replay",
    "prompt for online GRPO",
    (
        *_KEY,
        _c("prompt_id", _S, "prompt id, unique within the run", nullable=False),
        _c("task_id", _S, "task of the prompt", nullable=False),
        _c("suite", _S, "suite of the task"),
        _c("prompt_json", _S, "JSON list of message dicts"),
        _TOOLS,
        _c("task_json", _S, "the whole Task as JSON (the reward function re-verifies with it)"),
        _c("p_success", _F, "estimated success rate of the current policy (for filtering)"),
        _SOURCE_VERSIONS,
    ),
)

EVALS = TableSpec(
    "evals",
    "evaluation metric of a model on a suite",
    (
        *_KEY,
        _c("model_id", _S, "model evaluated", nullable=False),
        _c("suite", _S, "suite"),
        _c("split", _S, "train | heldout"),
        _c("metric", _S, "greedy_success | pass@k | search_success | ...", nullable=False),
        _c("value", _F, "metric value"),
        _c("ci_low", _F, "lower bound of the confidence interval"),
        _c("ci_high", _F, "upper bound of the confidence interval"),
        _c("n", _I, "number of tasks"),
        _c("details_json", _S, "JSON of per-axis metrics and settings"),
    ),
)

MODELS = TableSpec(
    "models",
    "model checkpoint",
    (
        *_KEY,
        _c("model_id", _S, "model id", nullable=False),
        _c("parent_id", _S, "model it was trained from; null for a base model"),
        _c("path", _S, "where the weights are"),
        _c("kind", _S, "base | dpo | sft | grpo | ..."),
        _c("config_json", _S, "JSON of the training config"),
        _c("dataset_versions_json", _S, "JSON {table: Delta version} of the training data"),
        _c("metrics_json", _S, "JSON of training metrics"),
        _c("created_at", TIMESTAMP, "when the row was written (filled by the store when null)"),
    ),
)

TABLES: dict[str, TableSpec] = {
    t.name: t for t in (RUNS, TASKS, NODES, TRAJECTORIES, PAIRS, SFT, REPLAY, EVALS, MODELS)
}


def table_spec(name: str) -> TableSpec:
    """The spec of table `name`; a clear error listing the known tables otherwise."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; the store has tables: {', '.join(TABLES)}") from None


def schema_doc() -> str:
    """Markdown of every table (docs/store.md includes it)."""
    return "\n\n".join(t.doc() for t in TABLES.values())
