"""Metrics, request ids and one structured log line per request."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.exchange.logs import JsonFormatter
from tests.support.polling import eventually
from tests.support.prometheus import metric
from tests.support.servers import MODEL, guard, simulator, simulator_in_memory


@pytest.fixture(scope="module")
def stack(deepseek_dir: Path) -> Iterator[tuple[str, Any]]:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=2048) as sim:
        with guard(sim, deepseek_dir, **{"model.max_model_len": 2048}) as proxy:
            yield proxy.url, sim.stats


def chat(url: str, content: str, max_tokens: int, **headers: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_metrics_move_with_the_traffic(stack: tuple[str, Any]) -> None:
    url, _ = stack
    before = httpx.get(f"{url}/metrics").text
    assert chat(url, "hello", 5).headers["x-token-guard-action"] == "pass"
    assert chat(url, "hello", 5000).headers["x-token-guard-action"] == "clamp"
    assert chat(url, "word " * 3000, 5).status_code == 400
    assert chat(url, "word " * 3000, 5, **{"x-token-guard-overflow": "chunk"}).status_code == 200
    assert chat(url, "word " * 3000, 5, **{"x-token-guard-overflow": "truncate"}).status_code == 200
    httpx.get(f"{url}/v1/models")
    after = httpx.get(f"{url}/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    for action, status in [("pass", "200"), ("clamp", "200"), ("reject", "400"), ("chunk", "200"), ("truncate", "200")]:
        labels = {"model": MODEL, "endpoint": "/v1/chat/completions", "action": action, "status": status}
        assert (
            metric(text, "token_guard_requests_total", **labels)
            == metric(before, "token_guard_requests_total", **labels) + 1
        )
    me = {"model": MODEL, "endpoint": "/v1/chat/completions"}
    assert metric(text, "token_guard_clamped_tokens_total", **me) >= 5000 - 2048
    assert metric(text, "token_guard_overflow_rejections_total", **me) >= 1
    assert metric(text, "token_guard_truncated_tokens_total", **me) > 0
    assert metric(text, "token_guard_chunks_count", **me) >= 1
    assert metric(text, "token_guard_prompt_tokens_count", **me) >= 5
    assert metric(text, "token_guard_tokenize_seconds_count", model=MODEL) >= 5
    assert metric(text, "token_guard_upstream_first_byte_seconds_count", model="", endpoint="/v1/models") >= 1
    assert metric(text, "token_guard_count_cache_misses_total", model=MODEL) > 0


def test_request_id_is_honoured_forwarded_and_returned(stack: tuple[str, Any]) -> None:
    url, stats = stack
    response = chat(url, "hi", 3, **{"x-request-id": "trace-42"})
    assert response.headers["x-request-id"] == "trace-42"
    assert response.json()["id"] == "chatcmpl-trace-42"  # vLLM (and the simulator) make it the response id
    generated = chat(url, "hi", 3)
    assert len(generated.headers["x-request-id"]) == 32
    assert generated.json()["id"] == "chatcmpl-" + generated.headers["x-request-id"]
    rejected = chat(url, "word " * 3000, 3, **{"x-request-id": "too-long-1"})
    assert rejected.status_code == 400 and rejected.headers["x-request-id"] == "too-long-1"


def test_one_structured_line_per_request(stack: tuple[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    url, _ = stack
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    chat(url, "hello there", 4000, **{"x-request-id": "log-me"})
    assert eventually(lambda: any(getattr(r, "fields", {}).get("request_id") == "log-me" for r in caplog.records))
    (record,) = [r for r in caplog.records if getattr(r, "fields", {}).get("request_id") == "log-me"]
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "info" and line["logger"] == "token_guard.requests"
    assert line["model"] == MODEL and line["endpoint"] == "/v1/chat/completions" and line["action"] == "clamp"
    assert line["max_tokens_before"] == 4000 and line["max_tokens_after"] == 2048 - line["prompt_tokens"]
    assert line["status"] == 200 and line["total_s"] >= line["upstream_s"] >= line["upstream_first_byte_s"] > 0
    assert "log-me" in record.getMessage() and "action=clamp" in record.getMessage()


FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^ "]*)')


def text_fields(line: str) -> list[tuple[str, str]]:
    """The `name=value` pairs of a text request line, read as docs/operating.md describes them: a value is either plain
    (no space, no quote) or a JSON string in quotes. Nothing of the line is left outside a pair."""
    pairs = FIELD.findall(line)
    assert " ".join(f"{name}={value}" for name, value in pairs) == line, line
    return [(name, json.loads(value) if value.startswith('"') else value) for name, value in pairs]


def logged(caplog: pytest.LogCaptureFixture, request_id: str) -> logging.LogRecord:
    assert eventually(lambda: any(getattr(r, "fields", {}).get("request_id") == request_id for r in caplog.records))
    (record,) = [r for r in caplog.records if getattr(r, "fields", {}).get("request_id") == request_id]
    return record


FORGED_IDS = ["abc key=alice status=200", 'abc" status=500 x="', "abc\\ status=500", "trace=1 request_id=other"]


@pytest.mark.parametrize("given", FORGED_IDS)
def test_a_request_id_cannot_forge_fields_of_the_text_log_line(
    stack: tuple[str, Any], caplog: pytest.LogCaptureFixture, given: str
) -> None:
    url, _ = stack
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    assert chat(url, "hi", 3, **{"x-request-id": given}).headers["x-request-id"] == given
    record = logged(caplog, given)
    fields = text_fields(record.getMessage())
    names = [name for name, _ in fields]
    assert names.count("request_id") == 1 and dict(fields)["request_id"] == given
    assert names.count("status") == 1 and dict(fields)["status"] == "200"
    assert "key" not in names and "trace" not in names and "x" not in names
    assert dict(fields)["endpoint"] == "/v1/chat/completions" and dict(fields)["model"] == MODEL
    assert json.loads(JsonFormatter().format(record))["request_id"] == given  # the JSON format as it was


def test_a_path_cannot_forge_fields_or_lines_of_the_text_log(
    stack: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = stack
    caplog.set_level(logging.INFO, logger="token_guard")
    broken = httpx.get(f"{url}/v1/nothing%20key=alice%0Astatus=200", headers={"x-request-id": "forged-line"})
    assert broken.status_code == 400  # a control character in the target: refused before anything else
    spaced = httpx.get(f"{url}/v1/nothing%20key=alice%20status=200", headers={"x-request-id": "forged-path"})
    assert spaced.status_code == 404  # no route: the request line's endpoint is only ever a declared route's path
    for rid in ("forged-line", "forged-path"):
        lines = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
        assert lines and all("\n" not in line for line in lines)  # one line each, with the path quoted in it
        assert not any(r.name == "token_guard.requests" for r in caplog.records if rid in r.getMessage())


def test_a_plain_request_line_is_written_as_it_always_was(
    stack: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = stack
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    chat(url, "hi", 3, **{"x-request-id": "plain-1"})
    record = logged(caplog, "plain-1")
    fields = record.fields  # type: ignore[attr-defined]
    assert record.getMessage() == " ".join(f"{name}={value}" for name, value in fields.items())
    assert '"' not in record.getMessage()


def test_client_disconnects_are_counted_with_how_long_the_guard_took_to_cancel(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=2048, itl_s=0.02) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"model.max_model_len": 2048}) as proxy:
            for stream in (True, False):  # left mid-stream, and while waiting for a whole answer
                body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 500,
                        "stream": stream}  # fmt: skip
                if stream:
                    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response:
                        next(response.iter_lines())
                else:
                    with pytest.raises(httpx.ReadTimeout):
                        httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=0.5)
            assert eventually(lambda: stats.aborted == 2)

            def counted() -> bool:
                text = httpx.get(f"{proxy.url}/metrics").text
                return (metric(text, "token_guard_client_disconnects_total") == 2
                        and metric(text, "token_guard_cancel_seconds_count") == 2)  # fmt: skip

            assert eventually(counted)  # each with the time its cancelling took (figures: tests/server/test_soak.py)


def test_a_finished_answer_is_not_counted_as_a_disconnect(stack: tuple[str, Any]) -> None:
    url, _ = stack
    before = metric(httpx.get(f"{url}/metrics").text, "token_guard_client_disconnects_total")
    for stream in (False, True):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream}
        assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 200
    assert metric(httpx.get(f"{url}/metrics").text, "token_guard_client_disconnects_total") == before
    assert metric(httpx.get(f"{url}/metrics").text, "token_guard_cancel_seconds_count") == 0
