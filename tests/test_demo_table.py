"""The demo's table from a demo flow's result: search against best-of-N at equal tokens, and
held-out greedy success before and after training."""

from __future__ import annotations

from dataengine.commands.demo import add_to_report, demo_rows, held_out_gain, markdown_table, search_counts
from dataengine.report.build import Report


def shard(trees, solved, tokens, seconds, skipped=False):
    return {"trees": trees, "solved_task_ids": solved, "generated_tokens": tokens, "seconds": seconds,
            "skipped": skipped, "successes": len(solved)}


def result(bon_shards, mcts_shards, before, after):
    return {"best_of_n": {"shards": bon_shards}, "rounds": [{"generate": {"shards": mcts_shards}}],
            "evals": [(0, "smollm2", before), (1, "/out/checkpoints/r1-sft", after)]}


BEFORE = {"units": (0.25, 0.13, 0.42)}


def test_rows_hold_each_method_and_ratios_at_equal_tokens():
    r = result([shard(6, ["a", "b"], 3000, 60.0), shard(6, ["c"], 3000, 60.0)],
               [shard(6, ["a", "b", "d"], 2900, 40.0), shard(6, ["c", "e", "f"], 3100, 80.0)],
               BEFORE, {"units": (0.69, 0.51, 0.82)})
    rows = {row[0]: row[1:] for row in demo_rows(r, 32)}
    assert rows["search, 12 train tasks"] == ("best-of-N", "MCTS", "MCTS / best-of-N")
    assert rows["train tasks solved"] == ("3", "6", "2.00x")
    assert rows["generated tokens"] == ("6,000", "6,000", "1.00x")
    assert rows["wall seconds"] == ("120", "120", "1.00x")
    assert rows["solved per M tokens"] == ("500", "1000", "2.00x")
    assert rows["solved per wall-minute"] == ("1.50", "3.00", "2.00x")
    assert rows["held-out greedy, 32 tasks [95% CI]"] == ("before (smollm2)", "after (r1-sft)", "change")
    assert rows["  units"] == ("0.25 [0.13, 0.42]", "0.69 [0.51, 0.82]", "+0.44")
    assert held_out_gain(r["evals"]) == ["units"]


def test_a_task_solved_in_two_shards_counts_once_and_a_resumed_run_has_no_rate_per_minute():
    counts = search_counts({"shards": [shard(2, ["a"], 100, 5.0), shard(2, ["a", "b"], 100, 0.0, skipped=True)]})
    assert counts == {"tasks": 4, "solved": 2, "tokens": 200, "seconds": 5.0, "resumed": True}
    r = result([shard(4, [], 400, 0.0, skipped=True)], [shard(4, ["a"], 380, 9.0)], BEFORE, {"units": (0.28, 0.15, 0.45)})
    rows = {row[0]: row[1:] for row in demo_rows(r, 32)}
    assert rows["solved per wall-minute"] == ("n/a (resumed)", "6.67", "n/a")
    assert rows["solved per M tokens"] == ("0", "2632", "n/a")  # best-of-N solved none: no ratio
    assert held_out_gain(r["evals"]) == []  # +0.03 with the intervals overlapping is no gain


def test_table_goes_into_the_reports_markdown_and_html(tmp_path):
    r = result([shard(4, ["a"], 400, 10.0)], [shard(4, ["a", "b"], 400, 10.0)], BEFORE, {"units": (0.5, 0.3, 0.7)})
    rows = demo_rows(r, 32)
    md = markdown_table(rows)
    assert md.splitlines()[0] == "| search, 4 train tasks | best-of-N | MCTS | MCTS / best-of-N |"
    assert "| **held-out greedy, 32 tasks [95% CI]** | **before (smollm2)** |" in md
    assert "| units | 0.25 [0.13, 0.42] | 0.50 [0.30, 0.70] | +0.25 |" in md
    report = Report(html=tmp_path / "report.html", markdown=tmp_path / "report.md")
    report.html.write_text("<html><body><h1>Run report</h1></body></html>")
    report.markdown.write_text("# Run report\n")
    add_to_report(report, rows)
    assert report.markdown.read_text().startswith("# Run report\n") and md in report.markdown.read_text()
    page = report.html.read_text()
    assert page.index("<h1>Run report</h1>") < page.index("What the engine is for") < page.index("</body>")
    assert "<td>0.50 [0.30, 0.70]</td>" in page and "<th>MCTS / best-of-N</th>" in page


def test_demo_episodes_end_at_the_search_depth_and_evaluate_in_one_batch(tmp_path):
    from dataengine.commands.demo import DEMO_SIZES, demo_config

    engine = demo_config(tmp_path, model="smollm2", suites=["units"], seed=0, rounds=1, sizes=DEMO_SIZES).engine
    assert engine.env.max_steps == engine.search.max_depth == DEMO_SIZES["max_depth"]
    assert engine.eval.batch_size == engine.eval.num_tasks == DEMO_SIZES["eval_tasks"]
