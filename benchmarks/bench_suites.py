"""Suite generation and task-file speed.

For each built-in suite: time to generate n_train + n_heldout tasks, to save and load them as
JSON Lines and as Parquet, and the file sizes. Ratios are against generation in the same run
(how much faster loading a saved file is than regenerating) and Parquet against JSONL.

    .venv/bin/python benchmarks/bench_suites.py            # 1000 train + 200 held-out per suite
    .venv/bin/python benchmarks/bench_suites.py --quick    # 100 + 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataengine.suites import generate_suite, list_suites, load_tasks, save_tasks


def _timed(fn, repeats: int = 3):
    """(best seconds of `repeats` runs, last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 train + 20 held-out tasks per suite")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n_train, n_heldout = (100, 20) if args.quick else (args.train, args.heldout)
    for name in list_suites():  # import every suite first, so import time is not counted
        generate_suite(name, 1, 0)
    print(f"{n_train} train + {n_heldout} held-out tasks per suite, best of 3 runs")
    header = (f"{'suite':<11}{'generate s':>11}{'tasks/s':>9}{'jsonl save':>11}{'jsonl load':>11}"
              f"{'pq save':>9}{'pq load':>9}{'gen/jsonl-load':>15}{'gen/pq-load':>12}{'jsonl KB':>10}{'pq KB':>8}")  # fmt: skip
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for name in list_suites():
            gen_s, tasks = _timed(lambda n=name: generate_suite(n, n_train, n_heldout, seed=args.seed))
            jsonl, parquet = Path(tmp) / f"{name}.jsonl", Path(tmp) / f"{name}.parquet"
            js_save, _ = _timed(lambda t=tasks, p=jsonl: save_tasks(t, p))
            js_load, back = _timed(lambda p=jsonl: load_tasks(p))
            pq_save, _ = _timed(lambda t=tasks, p=parquet: save_tasks(t, p))
            pq_load, back_pq = _timed(lambda p=parquet: load_tasks(p))
            assert back == tasks and back_pq == tasks
            print(f"{name:<11}{gen_s:>11.3f}{len(tasks) / gen_s:>9.0f}{js_save:>11.3f}{js_load:>11.3f}"
                  f"{pq_save:>9.3f}{pq_load:>9.3f}{gen_s / js_load:>15.2f}{gen_s / pq_load:>12.2f}"
                  f"{jsonl.stat().st_size / 1024:>10.0f}{parquet.stat().st_size / 1024:>8.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
