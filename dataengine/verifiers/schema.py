"""Format and syntax: the action parsed, and every call's arguments satisfy the tool's JSON schema.

Validators are compiled once per schema (jsonschema's Draft 2020-12 validator) and cached, so
checking a call costs one `iter_errors` pass, not a schema compile.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from dataengine.types import Episode, Step, Task, ToolCall, Verdict
from dataengine.verifiers.base import not_applicable, verdict

# id(parameters dict) -> (the dict, its compiled validator); the dict is kept so the id stays valid.
_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}
_MAX_CACHED = 4096


def compiled_validator(parameters: dict[str, Any]) -> Any:
    """The compiled jsonschema validator for one tool's parameter schema (cached)."""
    hit = _VALIDATORS.get(id(parameters))
    if hit is not None and hit[0] is parameters:
        return hit[1]
    cls = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"tool parameter schema is not valid JSON Schema: {exc.message}") from exc
    validator = cls(parameters)
    if len(_VALIDATORS) >= _MAX_CACHED:
        _VALIDATORS.clear()
    _VALIDATORS[id(parameters)] = (parameters, validator)
    return validator


def schema_errors(parameters: dict[str, Any], call: ToolCall) -> list[str]:
    """Messages for every way `call.arguments` breaks the schema (empty when it validates)."""
    validator = compiled_validator(parameters)
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '<arguments>'}: {err.message}"
        for err in validator.iter_errors(call.arguments)
    ]


class FormatVerifier:
    """The action parses; each call names a known tool's schema and its arguments validate.

    Step verdict: passed iff no parse error and no schema error (calls to unknown tools are
    left to WhichVerifier). Episode verdict: score = fraction of well-formed steps.
    details: errors (list of str), bad_steps (int).
    """

    name = "format"
    version = "1"

    def _step_errors(self, task: Task, step: Step) -> list[str]:
        action = step.action
        if action.parse_error is not None:
            return [f"parse error: {action.parse_error}"]
        specs = {t.name: t.parameters for t in task.tools}
        errors: list[str] = []
        for call in action.tool_calls:
            params = specs.get(call.name)
            if params is not None:
                errors.extend(f"{call.name}: {e}" for e in schema_errors(params, call))
        return errors

    def verify_step(self, task: Task, step: Step) -> Verdict:
        errors = self._step_errors(task, step)
        return verdict(self.name, self.version, not errors, errors=errors)

    def verify(self, episode: Episode) -> Verdict:
        if not episode.steps:
            return not_applicable(self.name, self.version, "episode has no steps")
        errors: list[str] = []
        bad = 0
        for i, step in enumerate(episode.steps):
            step_errors = self._step_errors(episode.task, step)
            if step_errors:
                bad += 1
                errors.extend(f"step {i}: {e}" for e in step_errors)
        score = 1.0 - bad / len(episode.steps)
        return verdict(self.name, self.version, bad == 0, score, errors=errors, bad_steps=bad)
