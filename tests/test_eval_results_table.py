"""The results experiment: the --quick run end to end, and the training stages' wiring on a
hand-built tree that has successes and pairs (the tiny model finds none by itself)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_derive import RUN, task_row, tree_nodes, tree_trajectories

from dataengine.derive import DeriveOptions, derive
from storage import Store

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_table.py"


def load_script():
    spec = importlib.util.spec_from_file_location("results_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is built.
    sys.modules["results_table"] = module
    spec.loader.exec_module(module)
    return module


def test_sizes_parse():
    script = load_script()
    size, out = script.parse(["--quick", "--eval-tasks", "3", "--out", "x"])
    assert (size.model, size.eval_tasks, out) == ("tiny", 3, Path("x"))
    assert script.parse([])[0].model == "smollm2"


@pytest.mark.slow
def test_quick_run_prints_every_stage(tmp_path):
    script = load_script()
    table = script.main(["--quick", "--out", str(tmp_path)])
    stages = ["base (few-shot)", "rs-SFT", "trajectory DPO", "step DPO (MCTS pairs)", "GRPO (from DPO)",
              "search at inference (base)"]
    body = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    assert [line.split(" | ")[0][2:] for line in body] == stages
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"][0]["greedy"][3] == 2
    evals = Store(tmp_path / "store").evals().collect()
    assert {"greedy_success", "pass@2", "search_success"} <= set(evals["metric"])


@pytest.mark.slow
def test_training_stages_on_derived_sets(tmp_path):
    script = load_script()
    store = Store(tmp_path / "store")
    store.append("nodes", tree_nodes(), run_id=RUN, shard_id="s0")
    store.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0")
    store.append("tasks", [task_row()], run_id=RUN, shard_id="s0")
    derive(store, ["sft", "trajectory-pairs", "step-pairs"], run_ids=[RUN], options=DeriveOptions())
    size = script.QUICK
    sft = script.training_rows(store, "sft", RUN)
    step = script.training_rows(store, "preference", RUN, "step")
    assert (len(sft), len(step), len(script.training_rows(store, "preference", RUN, "trajectory"))) == (1, 2, 2)
    assert step.versions == {"pairs": store.version("pairs")}
    info = script.train_stage("sft", "tiny", tmp_path / "sft", sft, size, store)
    dpo = script.train_stage("dpo", info.path, tmp_path / "dpo", step, size, store)
    models = store.models().collect()
    assert set(models["kind"]) == {"sft", "dpo"}
    assert models.filter(models["kind"] == "dpo")["parent_id"][0] == info.model_id
    assert Path(dpo.path, "config.json").is_file()
