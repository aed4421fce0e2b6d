"""Model-based verifiers for the cascade: an LLM judge and a discriminative reward model.

Both return dataengine.types.Verdict with a confidence, so `Cascade` escalates to them only
when the rule verifiers are unsure.

- `LLMJudge`: a rubric prompt over the episode's transcript; P(yes) is read from the policy's
  token probabilities of "yes"/"Yes" vs "no"/"No" as the reply (no sampling, deterministic).
  score = P(yes) normalised over the four answers; confidence = |2 * score - 1|.
- `RewardModelVerifier`: a sequence classifier (1 logit) trained with TRL's RewardTrainer on
  preference pairs (`train_reward_model`); score = sigmoid((r - offset) / scale).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dataengine.policy.base import Conversation, Policy
from dataengine.types import Episode, Message, Verdict

DEFAULT_RUBRIC = (
    "You grade an assistant that solves tasks with tools. The task is solved when the assistant's "
    "final answer is correct and complete, it called the right tools with the right arguments when "
    "a tool was needed, and it did not invent tool results."
)
YES, NO = ("yes", "Yes"), ("no", "No")


def episode_messages(episode: Episode) -> list[Message]:
    """The whole conversation of an episode: the task's messages, then each step's action and
    observations."""
    messages = list(episode.task.messages)
    for step in episode.steps:
        messages.append(step.action.to_message())
        messages.extend(step.observations)
    return messages


def _transcript(messages: Sequence[Message]) -> str:
    lines = []
    for m in messages:
        body = m.content or " ".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in m.tool_calls)
        lines.append(f"[{m.role}{':' + m.name if m.name else ''}] {body}")
    return "\n".join(lines)


class LLMJudge:
    """Generative judge: asks the model whether the episode solved its task, reads P(yes).

    policy: any Policy (its `score` gives the answer probabilities); rubric: what "solved"
    means; min_answer_mass: if the four answers get less total probability than this the judge
    abstains (passed=None, confidence 0).
    """

    version = "1"

    def __init__(self, policy: Policy, *, rubric: str = DEFAULT_RUBRIC, name: str = "llm_judge", min_answer_mass: float = 1e-3):
        self.policy, self.rubric, self.name, self.min_answer_mass = policy, rubric, name, min_answer_mass

    def prompt(self, episode: Episode) -> Conversation:
        """The judge's conversation for `episode`."""
        gold = episode.task.gold.answer
        reference = f"\nReference answer: {gold}" if gold is not None else ""
        user = (
            f"Tools available: {', '.join(t.name for t in episode.task.tools) or 'none'}{reference}\n\n"
            f"Transcript:\n{_transcript(episode_messages(episode))}\n\n"
            "Did the assistant solve the task? Answer yes or no."
        )
        return Conversation([Message(role="system", content=self.rubric), Message(role="user", content=user)])

    def verify(self, episode: Episode) -> Verdict:
        return self.verify_many([episode])[0]

    def verify_many(self, episodes: Sequence[Episode]) -> list[Verdict]:
        """Verdicts for several episodes with one batched score call."""
        answers = YES + NO
        convs = [self.prompt(e) for e in episodes for _ in answers]
        scored = self.policy.score(convs, [a for _ in episodes for a in answers], end_turn=False) if convs else []
        out = []
        for i in range(len(episodes)):
            probs = [math.exp(s.logprob) for s in scored[i * len(answers) : (i + 1) * len(answers)]]
            p_yes, p_no = sum(probs[: len(YES)]), sum(probs[len(YES) :])
            mass = p_yes + p_no
            details = {"p_yes": p_yes, "p_no": p_no, "model_id": self.policy.model_id}
            if mass < self.min_answer_mass:
                out.append(Verdict(name=self.name, version=self.version, score=0.0, passed=None, confidence=0.0, details=details | {"abstained": True}))
                continue
            score = p_yes / mass
            out.append(
                Verdict(name=self.name, version=self.version, score=score, passed=score >= 0.5, confidence=abs(2 * score - 1), details=details)
            )
        return out


PAIR_COLUMNS = ("prompt", "chosen", "rejected")


def train_reward_model(
    pairs: Any,
    output_dir: str | Path,
    *,
    base: str = "smollm2",
    epochs: float = 1.0,
    learning_rate: float = 1e-4,
    batch_size: int = 4,
    max_length: int = 1024,
    seed: int = 0,
    **config: Any,
) -> Path:
    """Train a reward model with TRL's RewardTrainer and save it (with tokenizer) to `output_dir`.

    pairs: a datasets.Dataset or a list of dicts in TRL's conversational preference format:
        prompt / chosen / rejected are message lists ({"role", "content"} dicts), optional
        `tools` (list of OpenAI-style tool schemas, or its JSON string).
    base: "smollm2", "tiny" or a folder; its causal LM weights start a 1-logit sequence classifier.
    config: more RewardConfig fields. Returns the output folder.
    """
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    from dataengine.models import load_model, model_folder

    dataset = pairs if isinstance(pairs, Dataset) else Dataset.from_list(list(pairs))
    missing = [c for c in ("chosen", "rejected") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"reward pairs lack column(s) {missing}; expected prompt/chosen/rejected message lists")
    if len(dataset) == 0:
        raise ValueError("no reward pairs to train on")
    folder = model_folder(base)
    _, tokenizer = load_model(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        use_cpu=not torch.cuda.is_available(),
        **config,
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return Path(output_dir)


class RewardModelVerifier:
    """Discriminative verifier: a trained reward model scores the whole episode conversation.

    path: folder written by `train_reward_model`; offset / scale calibrate sigmoid((r - offset) /
    scale) into [0, 1] (offset: the reward at which the model is undecided).
    """

    def __init__(self, path: str | Path, *, offset: float = 0.0, scale: float = 1.0, name: str = "reward_model", device: str = "cpu", batch_size: int = 8):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from dataengine.models import checkpoint_hash

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no reward model at {folder} (train one with train_reward_model)")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder).to(device).eval()
        self.offset, self.scale, self.name, self.batch_size = offset, scale, name, batch_size
        self.version = checkpoint_hash(folder)

    @torch.no_grad()
    def rewards(self, conversations: Sequence[Conversation]) -> list[float]:
        """Raw reward r per conversation (no sigmoid)."""
        out: list[float] = []
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id or 0
        for start in range(0, len(conversations), self.batch_size):
            batch = conversations[start : start + self.batch_size]
            ids = [
                list(self.tokenizer.apply_chat_template(c.chat(), tools=c.openai_tools(), tokenize=True, return_dict=False))
                for c in batch
            ]
            width = max(len(i) for i in ids)
            # Right padding: the classifier pools the last non-pad token (found from pad_token_id).
            input_ids = torch.tensor([i + [pad] * (width - len(i)) for i in ids], device=device)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=device)
            out.extend(self.model(input_ids=input_ids, attention_mask=mask).logits[:, 0].float().tolist())
        return out

    def verify(self, episode: Episode) -> Verdict:
        return self.verify_many([episode])[0]

    def verify_many(self, episodes: Sequence[Episode]) -> list[Verdict]:
        convs = [Conversation(episode_messages(e), e.task.tools) for e in episodes]
        verdicts = []
        for r in self.rewards(convs):
            score = 1.0 / (1.0 + math.exp(-(r - self.offset) / self.scale))
            verdicts.append(
                Verdict(name=self.name, version=self.version, score=score, passed=score >= 0.5, confidence=abs(2 * score - 1), details={"reward": r})
            )
        return verdicts
