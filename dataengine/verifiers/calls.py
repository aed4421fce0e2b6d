"""Which tool, when to call, and whether the calls ran: three rule verifiers on the call list."""

from __future__ import annotations

from dataengine.types import Episode, Step, Task, Verdict
from dataengine.verifiers.base import is_stateful, not_applicable, tool_names, verdict


def _wrong_tools(task: Task, names: list[str]) -> tuple[list[str], list[str]]:
    """(names not among the task's tools, names outside the gold calls' tools when gold names any).

    Stateful tasks are judged by end state and admit many call sequences (an extra lookup is
    fine), so there only existence is checked.
    """
    known = tool_names(task)
    unknown = [n for n in names if n not in known]
    gold = set() if is_stateful(task) else {c.name for c in task.gold.calls}
    off_gold = [n for n in names if gold and n in known and n not in gold]
    return unknown, off_gold


class WhichVerifier:
    """Every called tool exists, and is one the gold calls use when the task says which
    (not for stateful tasks, where the gold calls are one path among many).

    Score: fraction of calls that name a right tool. Not applicable when nothing was called.
    details: unknown (names not offered), off_gold (offered but not in the gold calls).
    """

    name = "which"
    version = "1"

    def verify_step(self, task: Task, step: Step) -> Verdict | None:
        names = [c.name for c in step.action.tool_calls]
        if not names:
            return None
        unknown, off_gold = _wrong_tools(task, names)
        bad = len(unknown) + len(off_gold)
        return verdict(self.name, self.version, bad == 0, 1.0 - bad / len(names), unknown=unknown, off_gold=off_gold)

    def verify(self, episode: Episode) -> Verdict:
        names = [c.name for c in episode.calls]
        if not names:
            return not_applicable(self.name, self.version, "no tool was called")
        unknown, off_gold = _wrong_tools(episode.task, names)
        bad = len(unknown) + len(off_gold)
        return verdict(self.name, self.version, bad == 0, 1.0 - bad / len(names), unknown=unknown, off_gold=off_gold)


class WhenVerifier:
    """A tool was called if and only if the task needs one (task.gold.needs_tool).

    details: needs_tool, calls (how many calls the episode made).
    """

    name = "when"
    version = "1"

    def verify(self, episode: Episode) -> Verdict:
        needs = episode.task.gold.needs_tool
        n = len(episode.calls)
        return verdict(self.name, self.version, (n > 0) == needs, needs_tool=needs, calls=n)


class ExecutionVerifier:
    """Every call ran without an error, a timeout or a crash (ToolResult.status == "ok").

    Score: fraction of ok results. Not applicable when no call was executed.
    details: failures (list of {"tool", "status", "error"}).
    """

    name = "execution"
    version = "1"

    @staticmethod
    def _check(results: list) -> tuple[int, list[dict]]:
        failures = [
            {"tool": r.call.name, "status": r.status, "error": (r.error or "")[:200]} for r in results if not r.ok
        ]
        return len(results), failures

    def verify_step(self, task: Task, step: Step) -> Verdict | None:
        n, failures = self._check(step.results)
        if n == 0:
            return None
        return verdict(self.name, self.version, not failures, 1.0 - len(failures) / n, failures=failures)

    def verify(self, episode: Episode) -> Verdict:
        n, failures = self._check([r for s in episode.steps for r in s.results])
        if n == 0:
            return not_applicable(self.name, self.version, "no tool call was executed")
        return verdict(self.name, self.version, not failures, 1.0 - len(failures) / n, failures=failures)
