"""What docs/getting-started.md says about client libraries, checked with the real packages against the guard in front
of the simulator (vLLM 0.31 profile) on loopback: the OpenAI SDK, LangChain (langchain-openai) and LiteLLM as a
library.

Each library gets a prompt that cannot fit, through the guard and straight to vLLM, and a request whose max_tokens
would overflow, through the guard."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.support.servers import MODEL, guard, simulator

WINDOW = 2048
TOO_LONG = "All work and no play makes Jack a dull boy. " * 300  # about 3,300 tokens
HELLO = "Hello! Tell me about token budgets."


@pytest.fixture(scope="module", autouse=True)
def root_logger_of_our_own() -> Iterator[None]:
    """The guard logs a line per request. An earlier test may have left the root logger writing to a stream that is
    closed by now (tests/server/test_startup.py runs `serve`, which installs a handler on the captured stderr of
    that test), which prints 'Logging error' tracebacks; these tests log to no handler of their own."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers[:] = []
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="module")
def servers(deepseek_dir: Path) -> Iterator[tuple[str, str]]:
    """(the guard's base URL, vLLM's base URL), both as the OpenAI SDK wants them (ending in /v1)."""
    with (
        simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW) as (sim, _, _),
        guard(sim.url, deepseek_dir) as g,
    ):
        yield f"{g.url}/v1", f"{sim.url}/v1"


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    # LiteLLM fetches its model price list from the internet at import unless told to use the copy it ships.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        module = importlib.import_module("litellm")
    module.suppress_debug_info = True  # type: ignore[attr-defined]  # its "Give Feedback" lines on every error
    return module


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def chain(base_url: str, max_tokens: int = 16) -> ChatOpenAI:
    # ChatOpenAI takes max_tokens under its alias, and sends it as max_completion_tokens.
    return ChatOpenAI(
        model=MODEL, base_url=base_url, api_key=SecretStr("unused"), max_retries=0, max_completion_tokens=max_tokens
    )


# --- OpenAI SDK ---


def test_openai_sdk_gets_the_context_length_exceeded_code(servers: tuple[str, str]) -> None:
    guarded, direct = servers
    with pytest.raises(openai.BadRequestError) as through_guard:
        sdk(guarded).chat.completions.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": TOO_LONG}]
        )
    assert (through_guard.value.code, through_guard.value.param) == ("context_length_exceeded", "messages")
    with pytest.raises(openai.BadRequestError) as from_vllm:
        sdk(direct).chat.completions.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": TOO_LONG}]
        )
    assert from_vllm.value.code == "400"  # vLLM puts the HTTP status in `code`: nothing to tell overflow apart


def test_the_readme_snippet_never_exceeds_the_window(servers: tuple[str, str]) -> None:
    guarded, _ = servers
    reply = sdk(guarded).chat.completions.create(
        model=MODEL, max_tokens=100_000, messages=[{"role": "user", "content": "Hello!"}]
    )
    assert reply.usage is not None and reply.usage.total_tokens == WINDOW


# --- LangChain ---


def test_langchain_raises_a_bad_request_error_carrying_the_code(servers: tuple[str, str]) -> None:
    guarded, _ = servers
    with pytest.raises(openai.BadRequestError) as info:
        chain(guarded).invoke(TOO_LONG)
    assert info.value.code == "context_length_exceeded"


def test_langchain_classifies_the_guards_400_as_context_overflow(servers: tuple[str, str]) -> None:
    guarded, _ = servers
    with pytest.raises(ContextOverflowError):
        chain(guarded).invoke(TOO_LONG)


def test_langchain_gets_the_clamp_and_forced_tool_calls_through_the_guard(servers: tuple[str, str]) -> None:
    guarded, _ = servers
    reply = chain(guarded, max_tokens=100_000).invoke(HELLO)
    assert reply.usage_metadata is not None and reply.usage_metadata["total_tokens"] == WINDOW

    @tool
    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city."""
        return f"{city}: sunny for {days} days"

    called = chain(guarded, max_tokens=200).bind_tools([get_weather], tool_choice="get_weather").invoke(HELLO)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["args"]["days"] == 1


# --- LiteLLM as a client library ---


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
def test_litellm_raises_context_window_exceeded(litellm: ModuleType, servers: tuple[str, str], provider: str) -> None:
    guarded, direct = servers
    for base in (guarded, direct):  # LiteLLM reads vLLM's own message too
        with pytest.raises(litellm.ContextWindowExceededError):
            completion(litellm, provider, base, TOO_LONG, max_tokens=16)


def test_litellm_gets_the_clamp(litellm: ModuleType, servers: tuple[str, str]) -> None:
    guarded, _ = servers
    reply = completion(litellm, "hosted_vllm", guarded, HELLO, max_tokens=100_000)
    assert reply.usage.total_tokens == WINDOW


def completion(litellm: ModuleType, provider: str, base: str, content: str, max_tokens: int) -> Any:
    messages = [{"role": "user", "content": content}]
    return litellm.completion(
        model=f"{provider}/{MODEL}", api_base=base, api_key="unused", messages=messages, max_tokens=max_tokens
    )
