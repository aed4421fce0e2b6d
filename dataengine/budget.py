"""Budget accounting shared by the search, the baselines and rollouts: generated tokens per task.

Search and sampling are compared at equal generated tokens, so every token the policy samples
for a task (expansions, rollouts, best-of-N episodes) is charged to that task here. A search
batch may move a task's unspent tokens to other tasks of the batch (`transfer`): the batch
then spends at most the sum of its tasks' limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class TokenBudget:
    """Generated tokens per task of a batch, against a per-task limit.

    limit: tokens each task starts with (SearchConfig.max_generated_tokens); the last model
        call may overshoot a task's limit by at most one call's tokens.
    used: `[num_tasks]` tokens charged so far.
    received: `[num_tasks]` tokens moved to each task from other tasks (`transfer`).
    given: `[num_tasks]` tokens each task moved to other tasks.
    A task's own limit is limit + received - given.
    """

    limit: int
    used: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    given: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.used)
        self.received = self.received or [0] * n
        self.given = self.given or [0] * n

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

    def limit_of(self, task: int) -> int:
        """The task's limit after transfers: limit + received - given."""
        return self.limit + self.received[task] - self.given[task]

    def exhausted(self, task: int) -> bool:
        return self.used[task] >= self.limit_of(task)

    def remaining(self, task: int) -> int:
        return max(0, self.limit_of(task) - self.used[task])

    def transfer(self, task: int, to: Sequence[int]) -> int:
        """Move `task`'s remaining tokens to the tasks `to`, split evenly (the first ones in
        the given order get the remainder); the task is exhausted afterwards. Returns the
        tokens moved (0 when `to` is empty or nothing remains)."""
        targets = [t for t in to if t != task]
        amount = self.remaining(task)
        if not targets or amount == 0:
            return 0
        self.given[task] += amount
        share, rest = divmod(amount, len(targets))
        for i, t in enumerate(targets):
            self.received[t] += share + (1 if i < rest else 0)
        return amount

    @property
    def total(self) -> int:
        return sum(self.used)
