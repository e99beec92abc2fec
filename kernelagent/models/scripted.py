"""A Model that plays back canned replies, in order: for tests, demos and replays.

`--model scripted:FILE[,FILE...]` (any command that takes --model) plays files back: try the
whole pipeline without an API key or a model server. A `.py` file is one reply holding it as a
code block (a kernel: the "model" proposes it); a `.json` file is a list of replies (strings, or
objects with `content` and `tool_calls`); any other file is one reply, its text as is. The
replies repeat from the first when they run out, so a run ends when its budget does.

    kernelagent optimize benchmarks/level1/1_relu.py --model scripted:benchmarks/solutions/level1/1_relu.py
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Union

from kernelagent.models.base import ModelConfigError, ModelError, ModelReply, ToolCall, Usage

PREFIX = "scripted:"

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

    def __init__(self, replies: Iterable[Script], name: str = "scripted", cycle: bool = False) -> None:
        self.name = name
        self.replies = list(replies)
        self.script = list(self.replies) if cycle else []  # played again from the start when it runs out
        self.calls: list[dict[str, Any]] = []  # what each query was given

    def check_reachable(self) -> None:
        """Nothing to reach (the CLI asks every model before a run starts)."""

    def query(self, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None = None) -> ModelReply:
        self.calls.append({"messages": [dict(m) for m in messages], "tools": tools})
        if not self.replies and self.script:
            self.replies = list(self.script)
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


def from_spec(spec: str) -> ScriptedModel:
    """The model `--model scripted:FILE[,FILE...]` names (module doc). ModelConfigError (one line,
    exit 2) for a file that is missing or unreadable."""
    import json
    from pathlib import Path

    body = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    paths = [Path(part.strip()) for part in body.split(",") if part.strip()]
    if not paths:
        raise ModelConfigError(f"--model {spec}: name the reply files, e.g. {PREFIX}kernel.py (see --help)")
    replies: list[Script] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelConfigError(f"--model {spec}: reply file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelConfigError(f"--model {spec}: cannot read {path}: {exc}") from None
        if path.suffix == ".py":
            replies.append(text_reply(f"```python\n{text.rstrip()}\n```"))
        elif path.suffix == ".json":
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise ModelConfigError(f"--model {spec}: {path} is not JSON: {exc}") from None
            items = data if isinstance(data, list) else [data]
            if not all(isinstance(i, (str, dict)) for i in items) or not items:
                raise ModelConfigError(f"--model {spec}: {path} must hold a reply or a list of replies "
                                       "(strings, or objects with content and tool_calls)")
            replies.extend({"cost_known": True, **i} if isinstance(i, dict) else text_reply(i) for i in items)
        else:
            replies.append(text_reply(text))
    return ScriptedModel(replies, name=f"{PREFIX}{','.join(p.name for p in paths)}", cycle=True)


def make_model(name: str | None, **settings: Any) -> Any:
    """`--model NAME`: a scripted model for `scripted:...`, else litellm's (LitellmModel's settings)."""
    if name and name.startswith(PREFIX):
        return from_spec(name)
    from kernelagent.models.litellm_model import LitellmModel

    return LitellmModel(name, **settings)
