"""The safe fallback, against real vLLM: a model whose chat template the guard cannot render is, after the start-up
check (counting.source auto), counted by the upstream itself, and still clamped exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e import runtime
from tests.e2e.stack import PROXY_READY_TIMEOUT, Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT
from tests.support.polling import eventually

pytestmark = pytest.mark.e2e

# What the guard makes of this model's template: nothing it can render (vLLM renders the model's own).
UNRENDERABLE = "{{ raise_exception('a template this guard cannot render') }}"


@pytest.fixture(scope="module")
def blind_guard(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp(f"blind-{stack.version}")
    template = workdir / "unrenderable.jinja"
    template.write_text(UNRENDERABLE)
    model_dir = Path(httpx.get(stack.vllm_url + "/v1/models").json()["data"][0]["root"])
    proxy = runtime.start_proxy(stack.vllm_url, model_dir, workdir, extra_args=["--chat-template", str(template)])
    try:
        proxy.wait_ready("/health", PROXY_READY_TIMEOUT)
        yield proxy.url
    finally:
        proxy.stop()


def test_an_unrenderable_model_is_counted_by_the_upstream_and_clamped_exactly(stack: Stack, blind_guard: str) -> None:
    hello = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}

    def source() -> str | None:
        answer = httpx.post(blind_guard + "/v1/chat/completions", json=hello, timeout=60)
        found: str | None = answer.headers.get("x-token-guard-count-source")
        return found

    # the start-up check runs once the models are known; until it has compared, the guard refuses (400)
    assert eventually(lambda: source() == "upstream", timeout_s=60, interval_s=0.5)
    long = " ".join(f"w{i % 97}" for i in range(950))  # about 1,900 tokens: the clamped answer is short
    body = {"model": "tiny", "messages": [{"role": "user", "content": long}], "max_tokens": 4000, "temperature": 0}
    answer = httpx.post(blind_guard + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    prompt = int(answer.headers[GUARD_PROMPT])
    assert answer.headers["x-token-guard-count-source"] == "upstream"
    assert answer.headers[GUARD_ACTION] == "clamp"
    assert int(answer.headers["x-token-guard-max-tokens"]) == runtime.MAX_MODEL_LEN - prompt
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] == prompt
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= runtime.MAX_MODEL_LEN
