"""Counts that check themselves, against real vLLM 0.32 and 0.34: vLLM restarted on its port with a chat template
that adds a preamble, while the guard in front looks at it only when a request goes by (its health checks an hour
apart). The guard learns of it from the answers' usage: the mismatches show in /metrics and in its log, the model
moves to upstream counting once three of its last answers (and at least half) disagreed, and every request after
that is counted as vLLM charges it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e import runtime
from tests.e2e.stack import PROXY_READY_TIMEOUT, VLLM_READY_TIMEOUT
from tests.e2e.wire import GUARD_PROMPT
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

VERSIONS = [version for version in ("0.32.0", "0.34.0") if version in runtime.VERSIONS]
PREAMBLE = "This server was restarted with a template of its own, which says so in every prompt.\n"
QUIET = {"TOKEN_GUARD_UPSTREAM_HEALTH_INTERVAL_S": "3600"}
CONVERSATIONS = [
    [{"role": "user", "content": "Tell me about rivers."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a sea."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Go"}],
]


def asked(http: httpx.Client, guard: str, messages: list[dict[str, str]]) -> tuple[int, int, str]:
    """(the guard's count, what vLLM charged, who counted)."""
    body = {"model": runtime.SERVED_NAME, "messages": messages, "max_tokens": 1}
    answer = http.post(guard + "/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    counted, source = int(answer.headers[GUARD_PROMPT]), answer.headers["x-token-guard-count-source"]
    return counted, answer.json()["usage"]["prompt_tokens"], source


def total(exposition: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith(name + "{"))


Restarted = tuple[httpx.Client, str, runtime.Process, list[tuple[int, int, str]]]


@pytest.fixture(params=VERSIONS)
def restarted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restarted]:
    version: str = request.param
    tmp_path = tmp_path_factory.mktemp(f"template-{version}")  # short: vLLM's sockets live under it
    model = runtime.tiny_model(runtime.vllm_venv(runtime.VERSIONS[0]) / "bin" / "python")
    template = tmp_path / "preamble.jinja"
    template.write_text("{{ " + json.dumps(PREAMBLE) + " }}" + (model / "chat_template.jinja").read_text())
    port, venv = free_port(), runtime.vllm_venv(version)
    processes = [runtime.start_vllm(venv, model, tmp_path / "before", port=port)]
    try:
        processes[0].wait_ready("/v1/models", VLLM_READY_TIMEOUT)
        guard = runtime.start_proxy(processes[0].url, model, tmp_path / "guard", settings=QUIET)
        processes.append(guard)
        guard.wait_ready("/health", PROXY_READY_TIMEOUT)
        with httpx.Client(timeout=180) as http:
            before = [asked(http, guard.url, messages) for messages in CONVERSATIONS]
            processes[0].stop()
            changed = ("--chat-template", str(template))
            processes[0] = runtime.start_vllm(venv, model, tmp_path / "after", changed, port=port)
            processes[0].wait_ready("/v1/models", VLLM_READY_TIMEOUT)
            yield http, guard.url, guard, before
    finally:
        for process in reversed(processes):
            process.stop()


def test_a_template_changed_under_a_running_guard_is_counted_right_within_a_few_requests(
    restarted: Restarted,
) -> None:
    http, guard, process, before = restarted
    assert all(counted == charged and source == "local" for counted, charged, source in before)
    seen = [asked(http, guard, messages) for messages in CONVERSATIONS * 4]
    wrong = [i for i, (counted, charged, _) in enumerate(seen) if counted != charged]
    assert wrong and max(wrong) < 10, seen  # noticed, and exact again within 10 requests
    assert all(counted == charged and source == "upstream" for counted, charged, source in seen[max(wrong) + 1 :])
    scraped = http.get(guard + "/metrics").text
    assert total(scraped, "token_guard_count_mismatches_total") == len(wrong)
    assert "count mismatch: model tiny: vLLM charged" in process.log.read_text()
    assert "counted_upstream" in http.get(guard + "/health").json()
