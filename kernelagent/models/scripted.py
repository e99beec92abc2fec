"""A Model that plays back canned replies, in order: for tests, demos and replays."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Union

from kernelagent.models.base import ModelError, ModelReply, ToolCall, Usage

Script = Union[ModelReply, str, dict, Callable[[list, Any], ModelReply]]


def text_reply(content: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> ModelReply:
    return ModelReply(content=content, usage=Usage(prompt_tokens, completion_tokens),
                      cost_known=True)


def tool_reply(name: str, arguments: dict | str | None = None, content: str = "",
               call_id: str | None = None) -> ModelReply:
    """A reply with one tool call. `arguments` as a string is sent as is (may be bad JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ModelReply(content=content, cost_known=True,
                      tool_calls=[ToolCall(id=call_id or f"call_{name}", name=name,
                                           arguments_json=args)])


class ScriptedModel:
    """Returns `replies` one per query. An item may be a ModelReply, a string (a text
    reply), a dict (ModelReply fields; `tool_calls` as ToolCall or dicts), or a callable
    `(messages, tools) -> ModelReply`. Running out raises ModelError."""

    def __init__(self, replies: Iterable[Script], name: str = "scripted") -> None:
        self.name = name
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []  # what each query was given

    def query(self, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None = None) -> ModelReply:
        self.calls.append({"messages": [dict(m) for m in messages], "tools": tools})
        if not self.replies:
            raise ModelError(f"scripted model ran out of replies after {len(self.calls) - 1}")
        item = self.replies.pop(0)
        if callable(item) and not isinstance(item, ModelReply):
            item = item(messages, tools)
        if isinstance(item, str):
            return text_reply(item)
        if isinstance(item, dict):
            data = dict(item)
            data["tool_calls"] = [c if isinstance(c, ToolCall) else ToolCall(**c)
                                  for c in data.get("tool_calls", [])]
            if isinstance(data.get("usage"), dict):
                data["usage"] = Usage(**data["usage"])
            return ModelReply(**data)
        return item
