"""Audio transcription and translation end to end: the real `openai` SDK (a real multipart body) -> token-guard on
loopback -> the vLLM simulator in memory. No audio model runs on this machine's vLLM, so the simulator is the only
upstream these routes are tested against. The audio is not counted (`partial`, 0 prompt tokens); the form goes as
sent."""

from __future__ import annotations

import hashlib

import httpx
import openai

from tests.support.audio import wav
from tests.support.servers import MODEL, InMemorySim


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


def test_a_translation_without_a_limit_reaches_vllm_byte_for_byte(proxy: str, sim: InMemorySim) -> None:
    data = {"model": MODEL, "temperature": "0.2"}
    request = httpx.Request("POST", f"{proxy}/v1/audio/translations", data=data,
                            files={"file": ("s.wav", wav(), "audio/wav")})  # fmt: skip
    sent = request.read()
    with httpx.Client() as http:
        response = http.send(request)
    assert response.status_code == 200 and list(response.json()) == ["text"]
    assert response.headers["x-token-guard-action"] == "partial" and "x-token-guard-max-tokens" not in response.headers
    assert sim.stats.requests[-1] == {
        "form": data,
        "file_bytes": len(wav()),
        "sha256": hashlib.sha256(sent).hexdigest(),
    }


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
        httpx.post(url, data={"model": MODEL}, files={"other": ("a.wav", wav(), "audio/wav")}),  # no file part
        httpx.post(url, data={"max_completion_tokens": "lots"}, files={"file": ("a.wav", wav(), "audio/wav")}),
        httpx.post(url, content=b"--b\r\nno end", headers={"content-type": "multipart/form-data; boundary=b"}),
        httpx.post(url, content=b"x", headers={"content-type": "multipart/form-data"}),
    ]
    messages = [r.json()["error"]["message"] for r in cases]
    assert [r.status_code for r in cases] == [400] * 5
    assert "multipart/form-data body" in messages[0] and "no `file` part" in messages[1]
    assert "'max_completion_tokens' must be an integer" in messages[2] and "malformed" in messages[3]
    assert "no boundary" in messages[4] and sim.stats.received == before
