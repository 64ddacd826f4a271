"""Issue 6 against a real vLLM: the guard's /metrics counters move with the traffic it guarded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.corpus import LONG_TEXT
from tests.e2e.stack import Stack
from tests.e2e.wire import metric, sized_chat

pytestmark = pytest.mark.e2e


def test_metrics_count_what_the_guard_did(stack: Stack) -> None:
    messages: Any = [{"role": "user", "content": "hello"}]
    labels = {"model": "tiny", "endpoint": "/v1/chat/completions"}
    before = httpx.get(stack.proxy_url + "/metrics").text
    stack.guarded.chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0)
    near_full = sized_chat(stack, 2040)  # 100 asked, 8 left: clamped
    stack.guarded.chat.completions.create(model="tiny", messages=near_full, max_tokens=100, temperature=0)
    with pytest.raises(openai.BadRequestError):
        long: Any = [{"role": "user", "content": LONG_TEXT * 3}]
        stack.guarded.chat.completions.create(model="tiny", messages=long, max_tokens=2, temperature=0)
    after = httpx.get(stack.proxy_url + "/metrics").text
    for action, status in (("pass", "200"), ("clamp", "200"), ("reject", "400")):
        name = "token_guard_requests_total"
        assert (
            metric(after, name, **labels, action=action, status=status)
            >= metric(before, name, **labels, action=action, status=status) + 1
        )
    assert metric(after, "token_guard_clamped_tokens_total", **labels) > metric(
        before, "token_guard_clamped_tokens_total", **labels
    )
    assert metric(after, "token_guard_tokenize_seconds_count", model="tiny") >= 3
    sample = os.environ.get("TOKEN_GUARD_E2E_METRICS_SAMPLE")
    if sample:  # for the closing note: what an operator sees after the suite
        Path(sample).write_text("\n".join(line for line in after.splitlines() if line.startswith("token_guard_")))
