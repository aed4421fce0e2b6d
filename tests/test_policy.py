"""The hf policy backend on the tiny random model: batching, prefix reuse, seeding, stops, scoring."""

from __future__ import annotations

import pytest
import torch

from dataengine.policy import Conversation, Sample, cut_at_stop, make_policy
from dataengine.policy.hf import HFPolicy, PrefixCache, _attention_mask, _choose
from dataengine.types import Message, ToolSpec

ADD = ToolSpec(
    name="add",
    description="Add two numbers.",
    parameters={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
)
QUESTIONS = ["What is 17 plus 25?", "Add 3 and 4.", "What is 100 plus 250, please?"]


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return make_policy("hf", "tiny")


def convs() -> list[Conversation]:
    return [Conversation([Message(role="user", content=q)], [ADD]) for q in QUESTIONS]


def reference_logprobs(policy: HFPolicy, conv: Conversation, token_ids) -> list[float]:
    """Log-probs from one plain full forward, no cache, no padding."""
    prompt = policy.encode(conv)
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + list(token_ids)])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(token_ids)]


def test_sample_shapes_and_fields(policy):
    out = policy.sample(convs(), 3, max_new_tokens=12, seed=0)
    assert [len(row) for row in out] == [3, 3, 3]
    for row in out:
        for s in row:
            assert isinstance(s, Sample)
            assert s.num_tokens == len(s.token_ids) == len(s.logprobs) <= 12
            assert s.logprob == pytest.approx(sum(s.logprobs))
            assert all(lp <= 0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "stop_string", "length")


def test_sampled_logprobs_match_a_plain_forward(policy):
    out = policy.sample(convs()[:2], 2, max_new_tokens=10, seed=3)
    for conv, row in zip(convs(), out):
        for s in row:
            ref = reference_logprobs(policy, conv, s.token_ids)
            assert max(abs(a - b) for a, b in zip(ref, s.logprobs)) < 1e-4


def test_seeded_and_independent_of_batch_and_reuse(policy):
    a = policy.sample(convs(), 2, max_new_tokens=10, seed=7)
    b = policy.sample(convs(), 2, max_new_tokens=10, seed=7)
    c = policy.sample(convs(), 2, max_new_tokens=10, seed=8)
    alone = policy.sample(convs()[1:2], 2, max_new_tokens=10, seed=7)
    plain = HFPolicy(policy.model, policy.tokenizer, prefix_reuse=False).sample(convs(), 2, max_new_tokens=10, seed=7)
    ids = lambda out: [[s.token_ids for s in row] for row in out]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    assert ids(alone)[0] == ids(a)[1]
    assert ids(plain) == ids(a)
    # The K samples of one state differ (random tiny model, 10 tokens).
    assert a[0][0].token_ids != a[0][1].token_ids


def test_prefix_reuse_saves_prefill(policy):
    fresh = HFPolicy(policy.model, policy.tokenizer)
    plain = HFPolicy(policy.model, policy.tokenizer, prefix_reuse=False)
    k = 4
    fresh.sample(convs(), k, max_new_tokens=4, seed=0)
    plain.sample(convs(), k, max_new_tokens=4, seed=0)
    prompt_lens = [len(fresh.encode(c)) - 1 for c in convs()]
    assert plain.stats.prefill_tokens == k * sum(prompt_lens)
    # Shared system prefix once, then each prompt's own rest once.
    assert fresh.stats.prefill_tokens < sum(prompt_lens) * 0.5
    # A child state (parent + action + observation) reuses the parent's prompt.
    before = fresh.stats.prefill_tokens
    child = convs()[0].extend(
        Message(role="assistant", content='<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'),
        Message(role="tool", name="add", content="42"),
    )
    fresh.sample([child], 2, max_new_tokens=4, seed=0)
    assert fresh.stats.prefill_tokens - before < 60
    assert fresh.stats.cached_tokens > 0


def test_score_matches_plain_forward_and_validates(policy):
    conts = ['<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>', "7", "seven"]
    scored = policy.score(convs(), conts)
    for conv, s in zip(convs(), scored):
        assert s.token_ids[-1] == policy.end_turn_id
        ref = reference_logprobs(policy, conv, s.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, s.logprobs)) < 1e-4
    no_end = policy.score(convs()[:1], conts[:1], end_turn=False)[0]
    assert no_end.num_tokens == scored[0].num_tokens - 1
    with pytest.raises(ValueError, match="one continuation per conversation"):
        policy.score(convs(), conts[:1])


def test_greedy_is_deterministic_argmax(policy):
    s = policy.sample(convs()[:1], 2, max_new_tokens=6, temperature=0.0)[0]
    assert s[0].token_ids == s[1].token_ids
    ref = reference_logprobs(policy, convs()[0], s[0].token_ids[:1])
    prompt = policy.encode(convs()[0])
    with torch.no_grad():
        first = policy.model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert s[0].token_ids[0] == first and ref[0] <= 0


def test_stop_string_cuts_the_turn(policy):
    # Force the stop: treat a token the tiny model produces as a stop string.
    first = policy.sample(convs()[:1], 1, max_new_tokens=6, seed=11)[0][0]
    piece = policy.tokenizer.decode(first.token_ids[2:3])
    stopper = HFPolicy(policy.model, policy.tokenizer, stop_strings=(piece,))
    s = stopper.sample(convs()[:1], 1, max_new_tokens=6, seed=11)[0][0]
    assert s.finish_reason == "stop_string"
    assert piece not in s.text and s.num_tokens <= 3
    assert s.token_ids == first.token_ids[: s.num_tokens]
    assert cut_at_stop("a <tool_response> b") == ("a ", True)
    assert cut_at_stop("plain") == ("plain", False)


def test_bad_arguments_are_clear_errors(policy):
    with pytest.raises(ValueError, match="k must be"):
        policy.sample(convs(), 0)
    with pytest.raises(ValueError, match="top_p"):
        policy.sample(convs(), 1, top_p=0)
    with pytest.raises(ValueError, match="at least one message"):
        Conversation([], [])
    with pytest.raises(ValueError, match="unknown policy backend"):
        make_policy("onnx", "tiny")
    assert policy.sample([], 2) == []


def test_top_p_and_temperature_sampling_math():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits, -1)[0]
    # top_p below the first token's mass keeps only it, whatever the draw.
    for u in (0.0, 0.5, 0.999):
        assert _choose(logits, 1.0, float(probs[0]) - 0.01, torch.tensor([u])).item() == 0
    # Inverse CDF: a draw just past the first token's mass picks the second token.
    assert _choose(logits, 1.0, 1.0, torch.tensor([float(probs[0]) + 1e-3])).item() == 1
    assert _choose(logits, 0.0, 1.0, torch.tensor([0.9])).item() == 0


def test_attention_mask_lets_padding_see_itself():
    valid = torch.tensor([[False, True, True], [True, True, True]])
    mask = _attention_mask(valid, 2)
    assert mask.shape == (2, 1, 2, 3)
    assert mask[0, 0].tolist() == [[False, True, False], [False, True, True]]
    assert mask[1, 0].tolist() == [[True, True, False], [True, True, True]]


def test_prefix_cache_lru_and_longest_match():
    def kv(n):
        return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]

    cache = PrefixCache(max_tokens=10)
    cache.put([1, 2, 3, 4], kv(4))
    cache.put([1, 2, 9], kv(3))
    n, got = cache.longest([1, 2, 3, 7, 8], limit=5)
    assert n == 3 and got[0][0].shape[2] == 3
    assert cache.longest([1, 2, 3, 4, 5], limit=2)[0] == 2
    assert cache.longest([5, 6], limit=2) == (0, None)
    cache.put([7, 7, 7, 7], kv(4))  # 11 tokens > 10: the least recently used entry goes
    assert len(cache) == 2 and cache.tokens <= 10


def test_fewshot_option_changes_the_prompt():
    with_examples = make_policy("hf", "tiny", fewshot=True)
    without = make_policy("hf", "tiny", fewshot=False)
    custom = make_policy("hf", "tiny", fewshot="EXAMPLES HERE", device="auto")
    conv = convs()[0]
    assert "<tool_response>" in with_examples.render(conv)
    assert "<tool_response>\n" not in without.render(conv)
    assert "EXAMPLES HERE" in custom.render(conv) and "<tool_response>\n" not in custom.render(conv)
    assert '{"type": "function"' in make_policy("hf", "tiny", listing="json").render(conv)
    assert len(without.encode(conv)) < len(with_examples.encode(conv))
