"""Audio transcription and translation end to end: the real `openai` SDK (a real multipart body) -> token-guard on
loopback -> the vLLM simulator in memory. No audio model runs on this machine's vLLM, so the simulator is the only
upstream these routes are tested against, and it reads a form as vLLM does (Starlette's python-multipart, then
FastAPI's binding). The audio is not counted (`partial`, 0 prompt tokens); the form goes written anew from what the
guard read, and one vLLM could read otherwise is refused."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.audio import wav
from tests.support.servers import MODEL, InMemorySim, keyed_guard, wait_checked, wait_healthy


def test_a_transcription_is_partial_with_its_limit_and_the_form_as_sent(oai: openai.OpenAI, sim: InMemorySim) -> None:
    raw = oai.audio.transcriptions.with_raw_response.create(
        model=MODEL, file=("speech.wav", wav(), "audio/wav"), language="en",
        extra_body={"max_completion_tokens": 12},
    )  # fmt: skip
    reply = raw.parse()
    assert reply.text and reply.usage is not None and reply.usage.type == "duration"
    assert raw.headers["x-token-guard-action"] == "partial" and raw.headers["x-token-guard-prompt-tokens"] == "0"
    assert raw.headers["x-token-guard-max-tokens"] == "12"
    assert "x-token-guard-count-source" not in raw.headers  # nobody counted the audio
    forwarded = sim.stats.requests[-1]
    assert forwarded["form"] == {"model": MODEL, "language": "en", "max_completion_tokens": "12"}
    assert forwarded["file_bytes"] == len(wav())


def test_a_translation_as_httpx_writes_it_reaches_vllm_byte_for_byte(proxy: str, sim: InMemorySim) -> None:
    """httpx writes a form as the guard writes one anew: nothing to change, it goes as it came."""
    data = {"model": MODEL, "temperature": "0.2"}
    request = httpx.Request("POST", f"{proxy}/v1/audio/translations", data=data,
                            files={"file": ("s.wav", wav(), "audio/wav")})  # fmt: skip
    sent = request.read()
    with httpx.Client() as http:
        response = http.send(request)
    assert response.status_code == 200 and list(response.json()) == ["text"]
    assert response.headers["x-token-guard-action"] == "partial" and "x-token-guard-max-tokens" not in response.headers
    forwarded = sim.stats.requests[-1]
    assert forwarded["form"] == data and forwarded["file_bytes"] == len(wav())
    assert forwarded["file_sha256"] == hashlib.sha256(wav()).hexdigest()
    assert forwarded["sha256"] == hashlib.sha256(sent).hexdigest()


def test_a_stream_passes_through_with_vllms_usage_event(oai: openai.OpenAI, sim: InMemorySim) -> None:
    stream = oai.audio.transcriptions.create(
        model=MODEL, file=("s.wav", wav(), "audio/wav"), stream=True,
        extra_body={"max_completion_tokens": 3, "stream_include_usage": True},
    )  # fmt: skip
    events = [event.model_dump() for event in stream]
    assert [e["object"] for e in events] == ["transcription.chunk"] * 4
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert sim.stats.requests[-1]["form"]["stream"] == "true"


def test_malformed_forms_are_400s_that_never_reach_vllm(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    url = f"{proxy}/v1/audio/transcriptions"
    cases = [
        httpx.post(url, json={"file": "x", "model": MODEL}),  # JSON, not a form
        httpx.post(url, data={"model": MODEL}, files={"other": ("a.wav", wav(), "audio/wav")}),  # not vLLM's
        httpx.post(url, data={"max_completion_tokens": "lots"}, files={"file": ("a.wav", wav(), "audio/wav")}),
        httpx.post(url, content=b"--b\r\nno end", headers={"content-type": "multipart/form-data; boundary=b"}),
        httpx.post(url, content=b"x", headers={"content-type": "multipart/form-data"}),
    ]
    messages = [r.json()["error"]["message"] for r in cases]
    assert [r.status_code for r in cases] == [400] * 5
    assert "multipart/form-data body" in messages[0] and "part 'other' is not a field" in messages[1]
    assert "'max_completion_tokens' must be an integer" in messages[2] and "malformed" in messages[3]
    assert "no boundary" in messages[4] and sim.stats.received == before


@pytest.fixture(scope="module")
def capped(sim: InMemorySim, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The guard with a key whose output is capped at 50 tokens."""
    config = tmp_path_factory.mktemp("capped") / "keys.toml"
    config.write_text(f'[[keys]]\nname = "capped"\nkey = "sk-capped"\nmax_output_tokens = 50\nmodels = ["{MODEL}"]\n')
    with keyed_guard(sim, deepseek_dir, config) as server:
        wait_healthy(server.url)
        wait_checked(server, sim)
        yield server.url


CAPPED = {"authorization": "Bearer sk-capped"}


def part(name: bytes, value: bytes, head: bytes = b"", filename: bytes | None = None) -> bytes:
    """A part of a form whose boundary is `b`, with `head` (more header lines) before its Content-Disposition."""
    extra = b'; filename="%s"' % filename if filename is not None else b""
    return b'--b\r\n%sContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n' % (head, name, extra, value)


def audio_form(*parts: bytes) -> bytes:
    return b"".join([*parts, part(b"file", wav(), filename=b"a.wav"), b"--b--\r\n"])


def post_form(url: str, raw: bytes, content_type: str = "multipart/form-data; boundary=b") -> httpx.Response:
    headers = {**CAPPED, "content-type": content_type}
    return httpx.post(f"{url}/v1/audio/transcriptions", content=raw, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b"max_completion_tokens", b"100000"),
        (b"use_beam_search", b"true"),
        (b"n", b"8"),
        (b"model", b"other"),
    ],  # fmt: skip
)
def test_a_part_with_two_content_dispositions_is_refused_naming_it(
    capped: str, sim: InMemorySim, name: bytes, value: bytes
) -> None:
    """A reader of the first would see a harmless `temperature` beside the limit of 50 it checked; python-multipart,
    and so vLLM, reads the last."""
    before = sim.stats.received
    twice = (b'--b\r\nContent-Disposition: form-data; name="temperature"\r\n'
             b'Content-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (name, value))  # fmt: skip
    response = post_form(capped, audio_form(part(b"max_completion_tokens", b"50"), twice))
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "file", response.text
    assert error["message"] == (
        "The multipart/form-data body is malformed: part 'temperature' has 2 Content-Disposition headers, not one."
    )
    assert sim.stats.received == before


@pytest.mark.parametrize(
    ("raw", "param", "message"),
    [
        (audio_form(part(b"max_completion_tokens", b"50"), part(b"max_completion_tokens", b"100000")),
         "max_completion_tokens", "The form part 'max_completion_tokens' is given more than once; vLLM reads only "
         "the last, and token-guard reads such a field only once."),
        (audio_form(part(b"max_tokens", b"100000")), "max_tokens", "The form part 'max_tokens' is not a field of "
         "this endpoint's request in vLLM, which would ignore it; token-guard forwards only the fields vLLM reads."),
    ],
    ids=["a field twice", "a field vLLM does not know"],
)  # fmt: skip
def test_a_field_twice_or_one_vllm_does_not_know_is_refused_naming_it(
    capped: str, sim: InMemorySim, raw: bytes, param: str, message: str
) -> None:
    before = sim.stats.received
    response = post_form(capped, raw)
    assert response.status_code == 400 and response.json()["error"] == {
        "message": message, "type": "BadRequestError", "param": param, "code": 400}  # fmt: skip
    assert sim.stats.received == before


FORM = "multipart/form-data; boundary=b"
ODD = {  # forms the guard reads, each odd in a way python-multipart could read otherwise than another reader
    "header names in capitals, a name unquoted": (audio_form(
        part(b"language", b"en"), b"--b\r\nCONTENT-DISPOSITION: FORM-DATA; NAME=max_completion_tokens\r\n\r\n"
        b"100000\r\n"), FORM),
    "a preamble, and an epilogue holding a part": (b"preamble\r\n" + audio_form(
        part(b"max_completion_tokens", b"100000")) + part(b"max_completion_tokens", b"9") + b"--b--\r\n", FORM),
    "a part's own content type and charset": (audio_form(
        part(b"max_completion_tokens", b"100000", b"Content-Type: text/plain; charset=utf-16\r\n"),
        part(b"prompt", "é".encode())), FORM),
    "a charset in the request's content type": (audio_form(
        part(b"prompt", "é".encode()), part(b"max_completion_tokens", b"100000")), FORM + "; charset=latin-1"),
    "an escape in a quoted name": (audio_form(part(b"max_completion\\_tokens", b"100000")), FORM),
}  # fmt: skip


@pytest.mark.parametrize(("raw", "content_type"), ODD.values(), ids=ODD.keys())
def test_an_odd_form_reaches_vllm_as_the_guard_read_it(
    capped: str, sim: InMemorySim, raw: bytes, content_type: str
) -> None:
    """The key's cap of 50 is what vLLM reads, and the prompt the guard read: the form goes written anew, its audio
    as sent."""
    before = sim.stats.snapshot()["tokens_generated"]
    response = post_form(capped, raw, content_type)
    assert response.status_code == 200, response.text
    assert response.headers["x-token-guard-max-tokens"] == "50"
    forwarded = sim.stats.requests[-1]["form"]
    assert forwarded["max_completion_tokens"] == "50" and forwarded.get("prompt", "é") == "é"
    assert sim.stats.requests[-1]["file_sha256"] == hashlib.sha256(wav()).hexdigest()
    assert sim.stats.snapshot()["tokens_generated"] - before == 50
