"""The vllm backend's mapping of requests and outputs, driven by a stand-in engine.

These run in the main environment without vLLM; tests/test_vllm_engine.py runs the backend on a
real vLLM engine (`make test-vllm`). The stand-in follows vLLM's documented API
(`LLM.generate(prompts, sampling_params)` -> list of RequestOutput with `.outputs` of
CompletionOutput: text, token_ids, logprobs as [{token_id: Logprob}], finish_reason,
stop_reason; and `.prompt_logprobs`), and computes its numbers with the tiny model, so the
mapping is checked against real log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from dataengine.policy import Conversation, make_policy
from dataengine.policy.vllm import VLLMPolicy, _import_vllm
from dataengine.types import Message, ToolSpec

ADD = ToolSpec(name="add", description="Add two numbers.")


@dataclass
class SamplingParams:  # the documented fields this backend sets
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = 16
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]


class StandInEngine:
    """Answers like vllm.LLM, from the tiny model: completion i of a request is a scripted
    token sequence ending as scripted (eos, a stop string, or the length limit)."""

    def __init__(self, model: Any, tokenizer: Any, endings: list[str]):
        self.model, self.tokenizer, self.endings, self.requests = model, tokenizer, endings, []

    def _logprobs(self, ids: list[int]) -> list[float]:
        with torch.no_grad():
            logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
        return [logp[j - 1, ids[j]].item() for j in range(1, len(ids))]

    def generate(self, prompts, params, use_tqdm=True):
        params = params if isinstance(params, list) else [params] * len(prompts)
        self.requests.append((prompts, params))
        out = []
        for r, (prompt, p) in enumerate(zip(prompts, params)):
            ids = prompt["prompt_token_ids"]
            if p.prompt_logprobs is not None:
                lps = self._logprobs(ids)
                plp = [None] + [{t: Logprob(lp, 1)} for t, lp in zip(ids[1:], lps)]
                out.append(RequestOutput(str(r), ids, plp, [CompletionOutput(0, "", [], None, None, "length", None)]))
                continue
            completions = []
            for i in range(p.n):
                ending = self.endings[i % len(self.endings)]
                body = self.tokenizer(f"answer {i}", add_special_tokens=False)["input_ids"]
                if ending == "eos":
                    gen, text, finish, stop = body + [p.stop_token_ids[0]], f"answer {i}<|im_end|>", "stop", p.stop_token_ids[0]
                elif ending == "stop_string":
                    # Real vLLM cuts only the text: token_ids run through the stop string's tokens.
                    tail = self.tokenizer(p.stop[0], add_special_tokens=False)["input_ids"]
                    gen, text, finish, stop = body + tail, f"answer {i}", "stop", p.stop[0]
                else:
                    gen, text, finish, stop = body, f"answer {i}", "length", None
                lps = self._logprobs(ids + gen)[len(ids) - 1 :]
                completions.append(CompletionOutput(i, text, gen, sum(lps), [{t: Logprob(lp)} for t, lp in zip(gen, lps)], finish, stop))
            out.append(RequestOutput(str(r), ids, None, completions))
        return out


@pytest.fixture(scope="module")
def hf():
    return make_policy("hf", "tiny")


def make(hf, endings) -> tuple[VLLMPolicy, StandInEngine]:
    engine = StandInEngine(hf.model, hf.tokenizer, endings)
    return VLLMPolicy(engine, hf.tokenizer, model_id=hf.model_id, sampling_params_cls=SamplingParams), engine


def convs():
    return [Conversation([Message(role="user", content=q)], [ADD]) for q in ("What is 2 plus 3?", "Add 5 and 8.")]


def test_sample_request_mapping(hf):
    policy, engine = make(hf, ["eos", "stop_string", "length"])
    out = policy.sample(convs(), 3, max_new_tokens=20, temperature=0.7, top_p=0.9, seed=5)
    prompts, params = engine.requests[0]
    assert [p["prompt_token_ids"] for p in prompts] == [hf.encode(c) for c in convs()]
    for p in params:
        assert (p.n, p.max_tokens, p.temperature, p.top_p, p.logprobs) == (3, 20, 0.7, 0.9, 0)
        assert p.stop == ["<tool_response>"] and hf.end_turn_id in p.stop_token_ids
        assert p.skip_special_tokens is False
    assert params[0].seed != params[1].seed
    assert [[s.finish_reason for s in row] for row in out] == [["stop", "stop_string", "length"]] * 2
    s = out[0][0]
    assert s.text == "answer 0" and s.token_ids[-1] == hf.end_turn_id
    cut = out[0][1]  # the stop string's tokens are dropped from the turn, as the hf backend does
    body = hf.tokenizer("answer 1", add_special_tokens=False)["input_ids"]
    assert cut.text == "answer 1" and list(cut.token_ids) == body and cut.dropped_tokens > 0
    assert len(cut.logprobs) == len(body)
    assert s.logprob == pytest.approx(sum(s.logprobs)) and s.num_tokens == len(s.token_ids)
    assert policy.stats.sequences == 6 and policy.stats.generated_tokens == sum(x.generated_tokens for r in out for x in r)


def test_score_matches_hf_backend(hf):
    policy, engine = make(hf, ["eos"])
    conts = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "13"]
    got = policy.score(convs(), conts)
    want = hf.score(convs(), conts)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert engine.requests[0][1][0].prompt_logprobs == 0


def test_missing_vllm_is_a_clear_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install vllm"):
            _import_vllm()
        with pytest.raises(ImportError, match="backend='hf'"):
            make_policy("vllm", "tiny")
    else:
        pytest.skip("vLLM is installed here")
