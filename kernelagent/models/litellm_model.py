"""A Model backed by litellm: any hosted provider, or an OpenAI-compatible server
(`openai/<name>` with `api_base`).

litellm is imported lazily (it is slow to import and optional). Its own retries, and
the OpenAI client's, are turned off: tenacity here is the only retry layer, so the
number of requests a call makes is bounded and every retry is logged.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import TYPE_CHECKING, Any

from kernelagent import settings
from kernelagent.models.base import ModelConfigError, ModelError, ModelReply, ToolCall, Usage

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger(__name__)

ENV_MODEL = "KERNELAGENT_MODEL"
# OpenAI-compatible servers (vLLM, SGLang, llama.cpp, ...) mostly ignore the key, but the
# client refuses to send a request without one.
DUMMY_KEY = "sk-no-key-required"
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}


# What litellm's first completion imports lazily (its HTTP stack, proxy types, logging hooks):
# imported with litellm, before any call, so that no call's --model-timeout pays for them (issue 56:
# several seconds on a loaded machine). A name this litellm lacks is skipped.
FIRST_CALL_IMPORTS = ("tenacity", "httpcore", "h11", "litellm._service_logger", "litellm.proxy._types",
                      "litellm.llms.openai.chat.gpt_audio_transformation")


def import_litellm() -> Any:
    """Import litellm quietly: local price table (no network fetch), no banners on stdout; and
    what its first call would import (FIRST_CALL_IMPORTS)."""
    import importlib

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    litellm.num_retries = 0
    for name in FIRST_CALL_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a warm-up: the call imports what it needs anyway
            pass
    return litellm


def _has_mcp_gateway() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("litellm.responses.mcp") is not None
    except (ImportError, ValueError):
        return False


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_retryable(exc: BaseException) -> bool:
    """Rate limits, timeouts, dropped connections and 5xx: worth another try."""
    import openai

    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    status = _status(exc)
    return status is not None and (status in RETRY_STATUS or status >= 500)


def _timed_out(exc: BaseException) -> bool:
    """The call's timeout fired: no answer within --model-timeout (litellm reports it as HTTP 408)."""
    import openai

    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, (openai.APITimeoutError, TimeoutError)) or type(exc).__name__ in (
                "Timeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "ConnectTimeout"):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def connect_failure(exc: BaseException) -> BaseException | None:
    """The httpx.ConnectError under `exc`, if no connection was ever made (refused, DNS
    failure, unreachable host). litellm reports these as InternalServerError (HTTP 500),
    although no HTTP answer came; the cause chain tells."""
    import httpx

    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, httpx.ConnectError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _root_cause(exc: BaseException) -> str:
    while (exc.__cause__ or exc.__context__) is not None:
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip()
    if text.startswith("[Errno"):  # "[Errno 111] Connection refused" -> "Connection refused"
        text = text.split("]", 1)[-1].strip()
    return text or type(exc).__name__


def retry_after_seconds(exc: BaseException) -> float | None:
    """The server's Retry-After (seconds form), if the error carries a response."""
    # litellm keeps the provider's headers in `litellm_response_headers`; its `response`
    # is often a synthetic one without them.
    for headers in (getattr(exc, "litellm_response_headers", None),
                    getattr(exc, "headers", None),
                    getattr(getattr(exc, "response", None), "headers", None)):
        try:
            value = headers.get("retry-after") if headers else None
            if value is not None:
                return max(0.0, float(value))
        except (TypeError, ValueError, AttributeError):
            continue
    return None


def describe_error(exc: BaseException, limit: int = 300) -> str:
    status = _status(exc)
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {text}"


class LitellmModel:
    """`query()` sends one chat completion through litellm.completion, with retries."""

    def __init__(self, model: str | None = None, api_base: str | None = None,
                 api_key: str | None = None, timeout: float = 300.0, max_retries: int = 6,
                 backoff_base: float = 2.0, backoff_max: float = 60.0,
                 temperature: float | None = None, **extra: Any) -> None:
        model = model or settings.get(ENV_MODEL) or None
        if not model:
            raise ModelConfigError(
                f"no model given: pass --model (e.g. --model openai/gpt-4o, or scripted:FILE to play a file back "
                f"with no key) or set {ENV_MODEL}")
        self.name = model
        self.api_base = api_base
        self.timeout = timeout
        self.max_retries = max(0, int(max_retries))
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.temperature = temperature
        self.extra = extra
        self.api_key = self._resolve_key(api_key)
        import_litellm()  # now, not inside the first call's wall (a no-op when _resolve_key did it)
        # Retries are for a server that answered once (or gives HTTP errors): one that was
        # never reached on the first call is a wrong --api-base or no network, not a hiccup.
        self._answered = False

    def _resolve_key(self, api_key: str | None) -> str | None:
        """Fail now, in one line, when the provider needs a key that is not there."""
        if api_key:
            return api_key
        litellm = import_litellm()
        try:
            _, provider, dynamic_key, _ = litellm.get_llm_provider(
                model=self.name, api_base=self.api_base)
        except Exception:
            raise ModelConfigError(
                f"unknown model provider for '{self.name}': use a litellm model string such as "
                "openai/<name>, anthropic/<name>, or openai/<name> with --api-base") from None
        if dynamic_key:
            return dynamic_key
        if self.api_base and provider in ("openai", "hosted_vllm", "openai_like", "lm_studio"):
            return os.environ.get("OPENAI_API_KEY") or DUMMY_KEY
        missing = litellm.validate_environment(model=self.name, api_base=self.api_base).get(
            "missing_keys") or []
        if missing:
            raise ModelConfigError(
                f"model '{self.name}' needs an API key: set {' or '.join(missing)} "
                "(or pass --api-key)")
        return None

    def check_reachable(self, timeout: float = 5.0) -> None:
        """Before a run starts: a TCP connection to --api-base's host and port. A refusal or
        a name that does not resolve is a ModelConfigError now (one line, exit 2), not a
        minute of retries after the harness has started. A timeout proves nothing (a slow
        network): the real call and its retries decide then."""
        if not self.api_base:
            return
        import socket
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(self.api_base)
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ModelConfigError(f"--api-base {self.api_base!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not host:
            raise ModelConfigError(f"--api-base must be an http(s) URL such as http://localhost:8000/v1 "
                                   f"(got {self.api_base!r})")
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except (socket.timeout, TimeoutError):
            return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ModelConfigError(f"cannot reach the model server at {self.api_base}: {reason} "
                                   "(check --api-base and that the server is running)") from None

    # -- retries -----------------------------------------------------------------------
    def longest_call_s(self) -> float:
        """The longest one query() can take against a server that accepts and never answers:
        max_retries + 1 attempts of `timeout` seconds each, and between them the backoff, wait n
        (from 1) being backoff_base * 2**(n-1), up to 10% jitter added, at most backoff_max (a
        server's Retry-After is capped the same). The docs quote this bound (guides/optimize.md)."""
        waits = sum(min(self.backoff_max, 1.1 * self.backoff_base * 2 ** n) for n in range(self.max_retries))
        return (self.max_retries + 1) * self.timeout + waits

    def _wait(self, state: "tenacity.RetryCallState") -> float:
        exponential = self.backoff_base * 2 ** (state.attempt_number - 1)
        exponential *= 1 + 0.1 * random.random()  # a little jitter
        exc = state.outcome.exception() if state.outcome else None
        advised = retry_after_seconds(exc) if exc else None
        return min(max(exponential, advised or 0.0), self.backoff_max)

    def _log_retry(self, state: "tenacity.RetryCallState") -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning("model call failed (%s); retry %d/%d in %.1fs", describe_error(exc),
                    state.attempt_number, self.max_retries, wait)

    def query(self, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None = None) -> ModelReply:
        import tenacity

        litellm = import_litellm()
        kwargs: dict[str, Any] = dict(
            model=self.name, messages=messages, timeout=self.timeout,
            num_retries=0, max_retries=0,  # tenacity is the only retry layer
            **self.extra)
        if tools:
            kwargs["tools"] = tools
            if _has_mcp_gateway():
                # litellm >= 1.7x routes every tools call through its MCP gateway check,
                # which imports the optional `mcp` package; our tools are plain functions.
                kwargs["_skip_mcp_handler"] = True
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature

        def retry(exc: BaseException) -> bool:
            if connect_failure(exc) is None:
                self._answered = True  # an HTTP answer, or a timeout after connecting
            elif not self._answered:
                return False
            return is_retryable(exc)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(retry),
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._wait, before_sleep=self._log_retry, reraise=True)
        start = time.monotonic()
        try:
            response = retrying(litellm.completion, **kwargs)
        except Exception as exc:  # every failure leaves here as one ModelError line
            if not self._answered and connect_failure(exc) is not None:
                where = self.api_base or f"the API of '{self.name}'"
                raise ModelConfigError(
                    f"cannot reach the model server at {where}: {_root_cause(exc)} "
                    "(check --api-base and that the server is running)") from exc
            status = _status(exc)
            if status in (401, 403):
                raise ModelConfigError(
                    f"model '{self.name}' refused the API key (HTTP {status}): set a valid key "
                    "(--api-key or the provider's variable)") from exc
            if status == 404:
                raise ModelConfigError(
                    f"model '{self.name}' was not found (HTTP 404): check --model and "
                    "--api-base") from exc
            tries = self.max_retries + 1
            attempts = "" if not is_retryable(exc) else f" after {tries} attempt{'s' if tries != 1 else ''}"
            if _timed_out(exc):
                raise ModelError(f"the model server did not answer within --model-timeout {self.timeout:g} s"
                                 f"{attempts} ({time.monotonic() - start:.1f} s in all, backoff included)") from exc
            raise ModelError(f"model call failed{attempts}: {describe_error(exc)}") from exc
        self._answered = True
        latency = time.monotonic() - start
        return self._parse(litellm, response, latency)

    def _parse(self, litellm: Any, response: Any, latency: float) -> ModelReply:
        try:
            message = response.choices[0].message
        except (AttributeError, IndexError) as exc:
            raise ModelError(f"model returned no choices: {str(response)[:200]}") from exc
        calls = []
        for i, call in enumerate(getattr(message, "tool_calls", None) or []):
            function = getattr(call, "function", None)
            calls.append(ToolCall(id=getattr(call, "id", None) or f"call_{i}",
                                  name=getattr(function, "name", None) or "",
                                  arguments_json=getattr(function, "arguments", None) or ""))
        usage = getattr(response, "usage", None)
        tokens = Usage(prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                       completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0))
        cost, known = 0.0, False
        try:
            value = litellm.completion_cost(completion_response=response)
            if value is not None:
                cost, known = float(value), True
        except Exception:  # litellm has no price for this model: report 0.0, say so
            pass
        try:
            raw = response.model_dump()
        except Exception:
            raw = {"repr": repr(response)[:2000]}
        raw["cost_known"] = known
        return ModelReply(content=getattr(message, "content", None) or "", tool_calls=calls,
                          usage=tokens, cost_usd=cost, cost_known=known, latency_s=latency,
                          raw=raw)
