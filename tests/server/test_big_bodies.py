"""The largest bodies the guard accepts (just under the 32 MiB default max_body_bytes) cost bounded memory: a prompt
whose size alone proves it cannot fit is refused from that size, without being rendered or encoded; one that is
truncated is counted in slices and encoded with offsets only at its ends; a body of millions of small values is
refused before any is built; many such bodies at once hold no more than server.max_held_body_bytes (128 MiB), the
others answered 503 unread. The guard runs in a process of its own, so its peak memory (VmHWM) is its own, and with
its children's (the body parser) all the memory a body costs."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Stack, guard_and_simulator, peak_with_children_mb, reset_peaks, rss_mb
from tests.support.servers import MODEL

pytestmark = pytest.mark.serial  # its memory peaks and lease timings hold on a machine it does not share

CHAT = "/v1/chat/completions"
MAX_BODY = 32 * 2**20
PEAK_MB = 600  # the guard's documented ceiling for one largest request
AFTER_MB = 250  # what it may keep afterwards
HELD_PEAK_MB = 800  # thirty largest bodies at once, the parser child included: 659 MB measured (2,075 at e63017a)


@pytest.fixture(scope="module")
def stack(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with guard_and_simulator(deepseek_dir, tmp_path_factory.mktemp("big")) as running:
        yield running


def varied_words(megabytes: float, seed: int) -> str:
    """Text of fresh words (no cache helps): every word drawn from 50,000 random ones."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(50_000)]
    return " ".join(rng.choice(words) for _ in range(int(megabytes * 2**20 / 6.5)))


def post(stack: Stack, text: str, **headers: str) -> httpx.Response:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 10}).encode()
    return httpx.post(stack.url + CHAT, content=body, timeout=300,
                      headers={"content-type": "application/json", **headers})  # fmt: skip


def test_a_31_mb_prompt_is_refused_from_its_size_in_bounded_memory(stack: Stack) -> None:
    response = post(stack, varied_words(31, seed=1))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "However, your request has at least " in error["message"]
    assert response.headers["x-token-guard-action"] == "reject"
    assert response.headers["x-token-guard-count-source"] == "size"  # a floor, not a count
    assert int(response.headers["x-token-guard-prompt-tokens"]) > 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB
    assert rss_mb(stack.guard_pid) < AFTER_MB


def test_a_31_mb_prompt_is_not_chunked_once_counting_its_start_proves_it_needs_too_many_parts(stack: Stack) -> None:
    # This vocabulary has tokens of up to 256 bytes: the size floor alone proves the prompt over the window but not
    # over 64 parts; counting the text's start until it passes 64 x 2048 tokens does, without counting all of it.
    response = post(stack, varied_words(31, seed=3), **{"x-token-guard-overflow": "chunk"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "However, your request has at least " in error["message"]
    assert "The chunk policy was not applied: the prompt would take more than 64 chunks" in error["message"]
    assert response.headers["x-token-guard-count-source"] == "size"
    assert int(response.headers["x-token-guard-prompt-tokens"]) > 64 * 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB


def test_a_3_mb_prompt_is_truncated_exactly_in_bounded_memory(stack: Stack) -> None:
    response = post(stack, varied_words(3, seed=2), **{"x-token-guard-overflow": "truncate"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert response.headers["x-token-guard-action"] == "truncate"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["prompt_tokens"]
    assert usage["prompt_tokens"] + 10 <= 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB


def filled(element: bytes, size: int) -> bytes:
    """A small chat request with an unused field of `element`s that fills the body to `size` bytes at most."""
    head = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}).encode()
    head = head[:-1] + b', "unused": ['
    return head + b",".join([element] * ((size - len(head) - 2 + 1) // (len(element) + 1))) + b"]}"


@pytest.mark.parametrize(
    "raw",
    [filled(b"[]", MAX_BODY - 4096), filled(b"{}", MAX_BODY - 4096), filled(b"{}", 4 * 2**20 - 4096)],
    ids=["32 MiB of []", "32 MiB of {}", "4 MiB of {}"],
)
def test_a_body_of_millions_of_values_is_refused_before_any_is_built(stack: Stack, raw: bytes) -> None:
    reset_peaks(stack.guard_pid)
    response = httpx.post(stack.url + CHAT, content=raw, timeout=300, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"].endswith("JSON values; at most 131072 are accepted (server.max_json_values).")
    assert error["param"] is None
    assert peak_with_children_mb(stack.guard_pid) < PEAK_MB
    assert post(stack, "still there?").status_code == 200


def test_a_utf16_body_of_millions_of_values_is_refused_from_its_first_bytes(stack: Stack) -> None:
    """json.loads reads UTF-16 too, and "∀" (U+2200, bytes 00 22) is a quote to a scan of the body as UTF-8 bytes: at
    e63017a this 31.5 MiB body passed the bounds, was parsed and forwarded, the guard and its parser at 724 MB."""
    head = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "hidden": "∀"}, ensure_ascii=False
    )[:-1]
    text = head + ', "unused": [' + ",".join(["[]"] * ((63 * 2**20 // 4 - len(head) - 14) // 3)) + "]}"
    raw = text.encode("utf-16-le")
    assert 31 * 2**20 < len(raw) < MAX_BODY
    reset_peaks(stack.guard_pid)
    before = peak_with_children_mb(stack.guard_pid)
    response = httpx.post(stack.url + CHAT, content=raw, timeout=300, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["message"].startswith("The request body is UTF-16-LE text; a JSON request body")
    assert peak_with_children_mb(stack.guard_pid) - before < 2 * len(raw) / 2**20 + 32  # the body, held at most twice
    assert post(stack, "still there?").status_code == 200


def test_json_of_millions_of_values_in_tool_call_arguments_is_refused_too(deepseek_dir: Path, tmp_path: Path) -> None:
    """On a guard of its own: what the module's earlier 31 MB prompts leave in the shared guard (250-350 MB of RSS
    the allocator keeps, varying from run to run) would count in this request's peak."""
    arguments = b'{"a": [' + b",".join([b"[]"] * 10_000_000) + b"]}"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments.decode()}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with guard_and_simulator(deepseek_dir, tmp_path) as stack:
        response = httpx.post(stack.url + CHAT, json={"model": MODEL, "messages": messages}, timeout=300)
        assert response.status_code == 400, response.text
        assert "tool calls' arguments" in response.json()["error"]["message"]
        assert peak_with_children_mb(stack.guard_pid) < PEAK_MB


def test_a_prompt_of_token_ids_just_under_the_values_limit_is_counted(stack: Stack) -> None:
    prompt = [i % 1000 for i in range(131_000)]
    response = httpx.post(stack.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
                          timeout=300)  # fmt: skip
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert response.headers["x-token-guard-prompt-tokens"] == "131000"


def test_eight_of_the_largest_prompts_at_once_are_all_answered(stack: Stack) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": varied_words(31, seed=4)}]}).encode()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: httpx.post(stack.url + CHAT, content=body, timeout=300), range(8)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {400, 503} and 400 in statuses  # 128 MiB hold four of them at once
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 400} == {"context_length_exceeded"}
    for busy in (a for a in answers if a.status_code == 503):  # no room when it came: told to come back
        assert busy.headers["retry-after"] == "1" and busy.json()["error"]["code"] == "server_busy"
        assert httpx.post(stack.url + CHAT, content=body, timeout=300).status_code == 400
    assert post(stack, "still there?").status_code == 200


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_thirty_of_the_largest_bodies_at_once_hold_bounded_memory(
    deepseek_dir: Path, tmp_path: Path, chunked: bool
) -> None:
    """On a guard of its own, as a fresh sidecar: what earlier tests leave in the shared one would count."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * (31 * 2**20 // 5)}]})
    raw = body.encode()

    async def pieces() -> AsyncIterator[bytes]:  # no Content-Length: its share grows as it arrives
        for start in range(0, len(raw), 2**20):
            yield raw[start : start + 2**20]

    async def thirty(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=None)) as client:
            sent = [client.post(url + CHAT, content=pieces() if chunked else raw, headers={"content-type":
                    "application/json"}) for _ in range(30)]  # fmt: skip
            return await asyncio.gather(*sent)

    with guard_and_simulator(deepseek_dir, tmp_path) as fresh:
        answers = asyncio.run(thirty(fresh.url))
        statuses = [a.status_code for a in answers]
        assert set(statuses) == {400, 503}, statuses  # some refused from their size, the others told to come back
        assert all(a.headers["retry-after"] == "1" for a in answers if a.status_code == 503)
        assert peak_with_children_mb(fresh.guard_pid) < HELD_PEAK_MB
        assert post(fresh, "still there?").status_code == 200
