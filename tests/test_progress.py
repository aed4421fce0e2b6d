"""Progress of a stage when output is not a terminal: plain lines with rate and ETA."""

from __future__ import annotations

from dataengine.stages.progress import Progress


def test_progress_prints_lines_with_rate_and_eta_off_a_terminal(capsys):
    with Progress(4, "mcts", terminal=False, every_s=0.0) as bar:
        bar.update({"trees_done": 1, "simulations": 3, "tokens": 120, "successes": 1})
        bar.finish_shard()
        bar.update({"trees_done": 1, "tokens": 80})
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("mcts: 1/4 trees, 3 sims, 120 tokens") and "tok/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("mcts: 2/4 trees, 3 sims, 200 tokens") and lines[-1].endswith("(done)")


def test_progress_disabled_prints_nothing(capsys):
    with Progress(2, "greedy", enabled=False, terminal=False, every_s=0.0) as bar:
        bar.update({"trees_done": 2})
    assert capsys.readouterr().err == ""
