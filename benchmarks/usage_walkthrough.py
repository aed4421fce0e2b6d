"""docs/usage.md's walk-through, run as a new user runs it: every command in order, in a fresh folder,
with its wall time and what it printed. docs/usage.md's times come from this script.

    .venv/bin/python benchmarks/usage_walkthrough.py --workdir /tmp/walk            # SmolLM2
    .venv/bin/python benchmarks/usage_walkthrough.py --workdir /tmp/walk --model tiny  # smoke run

Run ids are taken from each command's JSON output, as a user copies them. The BFCL step needs a
predictions file: the script writes BFCL's own gold calls for the first 20 `simple` tasks (the
rest count as failures), the way one checks the checker before scoring a model. The schedule
step starts `prefect server start` on a free port, registers the schedule without serving it,
lists it and deletes it: serving blocks by design (a schedule fires only while it is served).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The flows' search at the sizes of the generate steps: level-1 tasks, 600 generated tokens per
# task, K = 2, 48 tokens per action (the defaults, 96 tokens and K = 4, take 4x as long).
SMALL = ["--set", "engine.levels=[1]", "--set", "engine.search.max_generated_tokens=600", "--set",
         "engine.search.num_actions=2", "--set", "engine.policy.max_new_tokens=48", "--set",
         "engine.eval.max_new_tokens=48"]


def summary(stdout: str, keys: tuple[str, ...]) -> str:
    """The JSON fields `keys` of a command's output, else its last line."""
    try:
        data = json.loads(stdout)
    except ValueError:
        # rich tables: skip border lines (box-drawing characters U+2500-U+257F only)
        lines = [line.strip() for line in stdout.splitlines()
                 if line.strip() and not all("\u2500" <= c <= "\u257f" or c.isspace() for c in line)]
        return lines[-1][:140] if lines else ""
    if isinstance(data, dict) and keys:
        return ", ".join(f"{k}={data[k]}" for k in keys if k in data)
    return json.dumps(data)[:140]


class Walk:
    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env, self.rows = workdir, env, []

    def run(self, label: str, argv: list[str], keys: tuple[str, ...] = (), timeout: float = 3600) -> str:
        shown = "dataengine " + shlex.join(argv)
        print(f"$ {shown}", flush=True)
        start = time.monotonic()
        proc = subprocess.run([str(BIN / "dataengine"), *argv], cwd=self.workdir, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        seconds = time.monotonic() - start
        (self.workdir / "logs").mkdir(exist_ok=True)
        (self.workdir / "logs" / f"{len(self.rows):02d}.log").write_text(f"$ {shown}\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"step '{label}' failed with exit code {proc.returncode}: {shown}")
        self.rows.append((label, shown, seconds, summary(proc.stdout, keys)))
        print(f"  {seconds:.0f} s  {self.rows[-1][3]}", flush=True)
        return proc.stdout

    def table(self) -> str:
        lines = ["| step | command | wall | output |", "|---|---|---|---|"]
        for label, shown, seconds, out in self.rows:
            lines.append(f"| {label} | `{shown}` | {seconds:.0f} s | {out.replace('|', '/')} |")
        return "\n".join(lines)


def write_bfcl_predictions(path: Path, category: str = "simple", n: int = 20) -> None:
    from dataengine.external.bfcl import gold_prediction, load_tasks

    tasks = load_tasks(category, limit=n)
    path.write_text("".join(json.dumps(gold_prediction(t)) + "\n" for t in tasks))


def schedule_steps(walk: Walk, model: str) -> None:
    from prefect_server import prefect_server  # tests/prefect_server.py

    saved, home = walk.env, walk.workdir / "prefect-server"
    home.mkdir()
    with prefect_server(home) as server:
        walk.env = dict(saved, PREFECT_HOME=server["env"]["PREFECT_HOME"], PREFECT_API_URL=server["url"])
        try:
            walk.run("register a schedule (not served)", ["schedule", "generate", "--name", "hourly", "--cron",
                                                          "0 * * * *", "--suite", "arithmetic", "--tasks", "8",
                                                          "--model", model, "--store", "store", "--no-serve"])
            walk.run("list schedules", ["schedule", "list"])
            walk.run("delete it", ["schedule", "delete", "hourly"])
        finally:
            walk.env = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="fresh folder the commands run in")
    parser.add_argument("--model", default="smollm2", help="smollm2 (docs/usage.md's figures) or tiny (smoke run)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty; the walk-through starts from nothing")
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               COLUMNS="100", PREFECT_HOME=str(args.workdir / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    (args.workdir / "prefect-home").mkdir()
    walk, m = Walk(args.workdir, env), args.model
    gen_keys = ("run_id", "trees", "successes", "solved", "generated_tokens")
    walk.run("list the suites", ["suites", "list"])
    walk.run("write a task file", ["suites", "generate", "--suite", "shop", "--train", "1000", "--heldout", "200",
                                   "--seed", "0", "--out", "tasks/shop.jsonl"])
    search = json.loads(walk.run("search (MCTS)", ["generate", "--suite", "arithmetic", "--tasks", "8", "--level", "1",
                                                   "--model", m, "--temperature", "0.7", "--max-new-tokens", "48",
                                                   "--sims", "32", "--k", "2", "--max-tokens", "600", "--store",
                                                   "store", "--no-progress"],
                                 gen_keys))["run_id"]
    sampled = json.loads(walk.run("sample (best-of-N)", ["generate", "--suite", "arithmetic", "--tasks", "8", "--level", "1", "--model", m,
                                    "--method", "best_of_n", "--n", "8", "--temperature", "0.7", "--max-new-tokens",
                                    "48", "--max-tokens", "600", "--store", "store", "--no-progress"], gen_keys))["run_id"]
    runs = ["--run", search, "--run", sampled]
    data = ["--run", "walk-data"]  # derived rows of both runs
    walk.run("re-verify a run", ["rescore", "--store", "store", "--run", search])
    walk.run("derive datasets", ["derive", "all", "--store", "store", *runs, "--out-run", "walk-data"])
    walk.run("export pairs", ["export", "pairs", "--store", "store", "--out", "data/pairs.parquet", "--min-margin", "0.2"])
    walk.run("fit a value model", ["train", "value", "--store", "store", "--run", search, "--model", m, "--out", "value.pt"])
    walk.run("SFT", ["train", "sft", "--store", "store", *data, "--init", m, "--out", "ckpt/sft", "--steps", "4"])
    walk.run("DPO", ["train", "dpo", "--store", "store", *data, "--init", "ckpt/sft", "--out", "ckpt/dpo",
                     "--behaviour-ref", "--steps", "4"])
    walk.run("GRPO", ["train", "grpo", "--store", "store", *data, "--init", "ckpt/dpo", "--out", "ckpt/grpo",
                      "--steps", "1", "--num-generations", "2", "--max-completion-length", "48", "--limit", "2"])
    walk.run("evaluate", ["eval", "--model", "ckpt/grpo", "--suite", "arithmetic", "--tasks", "16", "--store", "store",
                          "--k", "2", "--max-new-tokens", "48", "--search", "--sims", "4", "--search-k", "2",
                          "--value", "zero"])
    walk.run("report", ["report", *runs, "--store", "store", "--out", "reports"])
    walk.run("query", ["query", "--store", "store",
                       "SELECT suite, run_id, avg(CAST(success AS INT)) AS success FROM trajectories GROUP BY suite, run_id"])
    walk.run("check the store", ["store", "check", "--full", "--store", "store"])
    write_bfcl_predictions(args.workdir / "preds.jsonl")
    walk.run("BFCL verdicts", ["verify", "bfcl", "--category", "simple", "--predictions", "preds.jsonl",
                               "--out", "verdicts.jsonl"])
    walk.run("pipeline (1 round)", ["pipeline", "--suite", "arithmetic", "--tasks", "8", "--rounds", "1", "--model", m,
                                    "--eval-tasks", "8", "--train-steps", "2", "--store", "pipeline-store",
                                    "--out", "pipeline", "--report", "pipeline-report", *SMALL])
    walk.run("experiment (1 round)", ["experiment", "--suite", "arithmetic", "--rounds", "1", "--train-tasks", "8",
                                      "--heldout-tasks", "16", "--trainers", "sft,dpo", "--model", m,
                                      "--out", "experiment", *SMALL, "--set", "engine.eval.search=false"])
    schedule_steps(walk, m)
    table = walk.table()
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
