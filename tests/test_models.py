"""The model layer: ScriptedModel, and LitellmModel through the real litellm client against a
local fake OpenAI-compatible server (no network)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from kernelagent.models import (
    ModelConfigError,
    ModelError,
    ModelReply,
    ScriptedModel,
    ToolCall,
    Usage,
    text_reply,
    tool_reply,
)
from kernelagent.models.litellm_model import LitellmModel
from tests.fake_openai_server import FakeOpenAIServer, error, text, tool

HI = [{"role": "user", "content": "hi"}]
SCHEMA = [{"type": "function", "function": {"name": "compile", "description": "compile it",
                                            "parameters": {"type": "object", "properties": {
                                                "code": {"type": "string"}}}}}]


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def fast_model(server, name="openai/fake-coder", **kw) -> LitellmModel:
    kw = {"timeout": 5.0, "max_retries": 3, "backoff_base": 0.01, "backoff_max": 0.2, **kw}
    return LitellmModel(name, api_base=server.url, **kw)


# -- ScriptedModel ---------------------------------------------------------------------
def test_scripted_model_plays_back_in_order_and_records_calls():
    model = ScriptedModel(["first", tool_reply("compile", {"code": "x"}),
                           {"content": "c", "tool_calls": [{"id": "1", "name": "submit",
                                                            "arguments_json": "{}"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
                           lambda messages, tools: text_reply(f"{len(messages)} messages")])
    assert model.query(HI).content == "first"
    reply = model.query(HI, SCHEMA)
    assert reply.tool_calls == [ToolCall("call_compile", "compile", '{"code": "x"}')]
    reply = model.query(HI)
    assert reply.tool_calls[0].name == "submit" and reply.usage.total_tokens == 7
    assert model.query(HI + HI).content == "2 messages"
    assert model.calls[1]["tools"] == SCHEMA and len(model.calls) == 4
    with pytest.raises(ModelError, match="ran out"):
        model.query(HI)


def test_reply_to_message_is_openai_format():
    reply = ModelReply(content="", tool_calls=[ToolCall("c1", "compile", "{}")], usage=Usage(1, 2))
    assert reply.to_message() == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "compile", "arguments": "{}"}}]}
    assert reply.to_dict()["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


# -- LitellmModel: replies -------------------------------------------------------------
def test_text_reply_usage_latency_and_unknown_cost(server):
    server.add(text("hello", usage={"prompt_tokens": 11, "completion_tokens": 7}))
    reply = fast_model(server).query(HI)
    assert reply.content == "hello" and reply.tool_calls == []
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 7)
    assert reply.latency_s > 0
    # litellm has no price for a made-up model: cost 0.0, and the reply says so.
    assert reply.cost_usd == 0.0 and reply.cost_known is False and reply.raw["cost_known"] is False
    assert reply.raw["choices"][0]["message"]["content"] == "hello"
    body = server.requests[0]
    assert body["model"] == "fake-coder" and body["messages"] == HI and "tools" not in body


def test_known_model_gets_a_cost_from_litellm_prices(server):
    server.add(text("priced", usage={"prompt_tokens": 1000, "completion_tokens": 1000}))
    reply = fast_model(server, "openai/gpt-4o-mini").query(HI)
    assert reply.cost_known is True and reply.cost_usd > 0


def test_tool_call_reply_is_parsed_and_tools_are_sent(server):
    server.add(tool("compile", {"code": "print(1)"}), tool("compile", "{not json"))
    model = fast_model(server)
    reply = model.query(HI, SCHEMA)
    assert [(c.name, c.arguments_json) for c in reply.tool_calls] == [
        ("compile", '{"code": "print(1)"}')]
    assert reply.tool_calls[0].id
    assert server.requests[0]["tools"][0]["function"]["name"] == "compile"
    # Invalid JSON arguments come back verbatim: the agent, not the model layer, judges them.
    assert model.query(HI, SCHEMA).tool_calls[0].arguments_json == "{not json"


# -- LitellmModel: retries -------------------------------------------------------------
def test_429_500_and_timeout_are_retried_with_no_hidden_retries(server, caplog):
    server.add(error(429, retry_after="0"), error(500), {"delay": 2.0, "content": "late"},
               text("finally"))
    caplog.set_level(logging.WARNING, logger="kernelagent.models.litellm_model")
    reply = fast_model(server, timeout=0.5, max_retries=4).query(HI)
    assert reply.content == "finally"
    # Exactly one request per attempt: litellm's and the OpenAI client's retries are off.
    assert len(server.requests) == 4
    reasons = " ".join(r.getMessage() for r in caplog.records)
    assert "429" in reasons and "500" in reasons and "Timeout" in reasons
    assert reasons.count("retry") == 3


def test_retry_after_is_honoured(server):
    server.add(error(429, retry_after="0.6"), text("ok"))
    start = time.monotonic()
    assert fast_model(server, backoff_max=5.0).query(HI).content == "ok"
    assert time.monotonic() - start >= 0.6


def test_retries_are_bounded_then_model_error(server):
    server.add(*[error(503) for _ in range(5)])
    with pytest.raises(ModelError, match="after 3 attempts.*503"):
        fast_model(server, max_retries=2).query(HI)
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [401, 404])
def test_bad_key_or_model_is_a_config_error(server, status):
    server.add(error(status, message="nope"))
    with pytest.raises(ModelConfigError, match=f"HTTP {status}"):
        fast_model(server).query(HI)
    assert len(server.requests) == 1


def test_bad_request_is_not_retried(server):
    server.add(error(400, message="context too long"))
    with pytest.raises(ModelError, match="context too long") as info:
        fast_model(server).query(HI)
    assert len(server.requests) == 1 and "\n" not in str(info.value)


# -- LitellmModel: configuration -------------------------------------------------------
def test_no_model_is_one_clear_config_error(monkeypatch):
    monkeypatch.delenv("KERNELAGENT_MODEL", raising=False)
    with pytest.raises(ModelConfigError) as info:
        LitellmModel(None)
    message = str(info.value)
    assert "--model" in message and "KERNELAGENT_MODEL" in message and "\n" not in message
    assert info.value.exit_code == 2


def test_model_falls_back_to_env(monkeypatch, server):
    monkeypatch.setenv("KERNELAGENT_MODEL", "openai/from-env")
    assert LitellmModel(api_base=server.url).name == "openai/from-env"


@pytest.mark.parametrize("model,key", [("openai/gpt-4o", "OPENAI_API_KEY"),
                                       ("anthropic/claude-3-5-sonnet-20240620", "ANTHROPIC_API_KEY")])
def test_missing_key_names_the_variable(monkeypatch, model, key):
    monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ModelConfigError, match=key) as info:
        LitellmModel(model)
    assert "\n" not in str(info.value)


def test_custom_api_base_needs_no_key(monkeypatch, server):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.add(text("local"))
    assert LitellmModel("openai/local-model", api_base=server.url,
                        max_retries=0).query(HI).content == "local"


def test_explicit_key_is_used(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert LitellmModel("openai/gpt-4o", api_key="sk-test").api_key == "sk-test"


def test_importing_the_package_does_not_import_litellm():
    code = ("import sys, kernelagent.models, kernelagent.models.litellm_model, kernelagent.agent; "
            "sys.exit(1 if 'litellm' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
