"""Budget accounting shared by the search and the baselines: generated tokens per task.

Search and sampling are compared at equal generated tokens, so every token the policy samples
for a task (expansions, rollouts, best-of-N episodes) is charged to that task here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenBudget:
    """Generated tokens per task of a batch, against a per-task limit.

    limit: most generated tokens one task may use (SearchConfig.max_generated_tokens); the
        last model call may overshoot it by at most one call's tokens.
    used: `[num_tasks]` tokens charged so far.
    """

    limit: int
    used: list[int] = field(default_factory=list)

    @classmethod
    def for_tasks(cls, num_tasks: int, limit: int) -> TokenBudget:
        if limit < 1:
            raise ValueError(f"the token budget per task must be >= 1, got {limit}")
        return cls(limit=limit, used=[0] * num_tasks)

    def charge(self, task: int, tokens: int) -> None:
        self.used[task] += int(tokens)

    def charge_split(self, tasks: list[int], tokens: int) -> None:
        """Split `tokens` of one batched call over the tasks it served (one entry per item)."""
        if not tasks:
            return
        share, rest = divmod(int(tokens), len(tasks))
        for i, task in enumerate(tasks):
            self.used[task] += share + (1 if i < rest else 0)

    def exhausted(self, task: int) -> bool:
        return self.used[task] >= self.limit

    def remaining(self, task: int) -> int:
        return max(0, self.limit - self.used[task])

    @property
    def total(self) -> int:
        return sum(self.used)
