"""Models the agent can talk to. `LitellmModel` imports litellm only when constructed."""

from kernelagent.models.base import (
    Model,
    ModelConfigError,
    ModelError,
    ModelReply,
    ToolCall,
    Usage,
)
from kernelagent.models.scripted import ScriptedModel, from_spec, make_model, text_reply, tool_reply


def __getattr__(name: str):  # lazy: importing kernelagent.models must not import litellm
    if name == "LitellmModel":
        from kernelagent.models.litellm_model import LitellmModel

        return LitellmModel
    raise AttributeError(name)


__all__ = ["LitellmModel", "Model", "ModelConfigError", "ModelError", "ModelReply",
           "ScriptedModel", "ToolCall", "Usage", "from_spec", "make_model", "text_reply", "tool_reply"]
