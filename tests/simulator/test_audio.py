"""The simulator's audio routes: a real multipart form in, vLLM's transcription and translation answers out (read
from vLLM 0.31 / 0.32's source: no audio model runs on this machine's vLLM)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.audio import wav
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)


def post(sim: RunningSim, path: str, data: dict[str, str], audio: bytes | None = None) -> httpx.Response:
    files = {"file": ("speech.wav", wav(2.5) if audio is None else audio, "audio/wav")}
    return sim.client.post(path, data=data, files=files, headers={"x-request-id": "r1"})


def test_a_transcription_runs_to_its_limit_and_bills_seconds(sim032: RunningSim) -> None:
    response = post(sim032, "/v1/audio/transcriptions", {"model": "tiny", "max_completion_tokens": "5"})
    body = response.json()
    assert response.status_code == 200 and list(body) == ["text", "usage"]
    assert body["usage"] == {"type": "duration", "seconds": 3} and sim032.stats.snapshot()["tokens_generated"] >= 5
    recorded = sim032.stats.snapshot()["requests"][-1]
    assert recorded["form"] == {"model": "tiny", "max_completion_tokens": "5"} and recorded["file_bytes"] > 80000


def test_a_translation_has_no_usage_and_a_limit_over_the_window_is_the_window(sim031: RunningSim) -> None:
    response = post(sim031, "/v1/audio/translations", {"max_completion_tokens": "99999"})
    assert list(response.json()) == ["text"]
    assert sim031.stats.snapshot()["tokens_generated"] >= 2048  # vLLM's get_max_tokens: never past max_model_len


def test_a_stream_tells_its_prompt_tokens_only_in_its_usage_event(sim032: RunningSim) -> None:
    data = {"stream": "true", "stream_include_usage": "true", "max_completion_tokens": "3", "prompt": "Hello"}
    events = post(sim032, "/v1/audio/transcriptions", data).text.split("\n\n")
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert events[-2:] == ["data: [DONE]", ""] and len(chunks) == 4
    assert chunks[0]["id"] == "transcribe-r1" and chunks[0]["object"] == "transcription.chunk"
    assert list(chunks[0]["choices"][0]) == ["delta"] and chunks[2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[3]["usage"]
    assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] == 4 + 1 + 250  # task, "Hello", 2.5 s of frames


@pytest.mark.parametrize(
    "data,audio,status,fragment",
    [
        ({"stream_include_usage": "true"}, None, 400, "Stream options can only be defined when `stream=True`."),
        ({"model": "nope"}, None, 404, "The model `nope` does not exist."),
        ({}, b"not audio", 400, "Invalid or unsupported audio file."),
        ({"max_completion_tokens": "0"}, None, 400, "max_tokens must be at least 1, got 0."),
        ({"response_format": "srt"}, None, 400, "Currently only support response_format"),
        ({"stream": "true", "use_beam_search": "true"}, None, 400, "Streaming is not currently supported with beam"),
    ],
)
def test_vllms_refusals(sim032: RunningSim, data: dict[str, str], audio: bytes | None, status: int,
                        fragment: str) -> None:  # fmt: skip
    response = post(sim032, "/v1/audio/transcriptions", data, audio)
    assert response.status_code == status and fragment in response.json()["error"]["message"]


def test_a_form_without_a_file_is_refused(sim032: RunningSim) -> None:
    response = sim032.client.post("/v1/audio/transcriptions", data={"model": "tiny"}, files={"x": ("a", b"", "a/b")})
    assert response.status_code == 400 and "'loc': 'body.file', 'msg': 'Field required'" in response.text
    body: dict[str, Any] = sim032.client.post("/v1/audio/transcriptions", json={"file": "x"}).json()
    assert "multipart/form-data" in body["error"]["message"]
