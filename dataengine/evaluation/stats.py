"""Estimators and confidence intervals of evaluation metrics.

- `wilson_interval`: 95% Wilson score interval of a proportion (good at small n and at 0 or 1,
  where the normal interval collapses).
- `pass_at_k`: the unbiased estimator of Chen et al. (2021): with n samples of which c pass,
  pass@k = 1 - C(n - c, k) / C(n, k), averaged over tasks.
- `bootstrap_interval`: percentile bootstrap over tasks of any per-task mean (seeded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# z of a two-sided 95% interval.
Z95 = 1.959963984540054
# Bootstrap resamples (the interval's ends move by well under 0.01 beyond this many).
RESAMPLES = 2000


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of successes/n; (0, 1) when n is 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Rounded so that 0 and 1 come out exact instead of 1e-17 away.
    return round(max(0.0, centre - half), 12), round(min(1.0, centre + half), 12)


def pass_at_k_task(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n samples, c of them correct (needs n >= k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if k < 1 or k > n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the stable form of 1 - C(n-c, k)/C(n, k).
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(samples: Sequence[int], correct: Sequence[int], k: int) -> list[float]:
    """Per-task unbiased pass@k (`samples[i]` samples, `correct[i]` correct for task i)."""
    if len(samples) != len(correct):
        raise ValueError(f"{len(samples)} sample counts but {len(correct)} correct counts")
    return [pass_at_k_task(int(n), int(c), k) for n, c in zip(samples, correct)]


def bootstrap_interval(values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (tasks resampled with replacement)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)
