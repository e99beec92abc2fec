"""The model protocol the agent loop talks to, and the plain data a model returns.

Messages are OpenAI chat-format dicts (role/content, assistant `tool_calls`, `tool`
results); tools are OpenAI function-calling schemas. Any object with a matching
`query` method is a model: litellm, a scripted list of replies, a policy under training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from kernelagent.errors import UserError


class ModelError(RuntimeError):
    """The model cannot answer and retrying will not help (bad request, auth, retries spent)."""


class ModelConfigError(ModelError, UserError):
    """No model, or no API key where the provider needs one. One line; CLI exit 2."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments_json: str  # as the model sent it: may be invalid JSON

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass
class ModelReply:
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    cost_known: bool = False  # False: the provider's price is unknown and cost_usd is 0.0
    latency_s: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in self.tool_calls
            ]
        return message

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "tool_calls": [c.to_dict() for c in self.tool_calls],
                "usage": self.usage.to_dict(), "cost_usd": self.cost_usd,
                "cost_known": self.cost_known, "latency_s": round(self.latency_s, 4)}


@runtime_checkable
class Model(Protocol):
    name: str

    def query(self, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None = None) -> ModelReply: ...
