"""The chat recipe's reading of `tools: []` by the upstream's release: refused by vLLM 0.31 to 0.33, no tools on 0.34
(unless tool_choice names one), as sent while the release is not known."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.chat import chat_request
from proxy.counting.registry import ModelRegistry
from proxy.errors import InvalidRequest
from proxy.policy.chat import as_upstream_tools


def registry(version: str | None) -> ModelRegistry:
    models = ModelRegistry([], discovering=True)
    if version is not None:
        models.set_upstream_version(version)
    return models


def request(**extra: Any) -> Any:
    return chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra})


@pytest.mark.parametrize("choice", [None, "auto", "required", "none"])
def test_vllm_034_reads_empty_tools_as_none(choice: str | None) -> None:
    extra = {} if choice is None else {"tool_choice": choice}
    assert as_upstream_tools(request(tools=[], **extra), registry("0.34.0")).tools is None


def test_a_named_tool_choice_keeps_the_empty_list_on_034() -> None:
    named = {"type": "function", "function": {"name": "f"}}
    assert as_upstream_tools(request(tools=[], tool_choice=named), registry("0.34.0")).tools == []


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0", "0.33.0"])
def test_earlier_releases_refuse_empty_tools_with_vllms_message(version: str) -> None:
    with pytest.raises(InvalidRequest, match=r"`tools` must not be an empty array\.") as err:
        as_upstream_tools(request(tools=[]), registry(version))
    assert err.value.param == "tools"


def test_an_unknown_release_leaves_empty_tools_as_sent() -> None:
    assert as_upstream_tools(request(tools=[]), registry(None)).tools == []


def test_tools_that_are_not_empty_are_left_alone() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert as_upstream_tools(request(tools=tools), registry("0.34.0")).tools == tools
    assert as_upstream_tools(request(), registry("0.33.0")).tools is None
