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
    assert "'loc': 'body.file', 'msg': 'Field required'" in body["error"]["message"]  # Starlette: no form in JSON
    text = sim032.client.post("/v1/audio/transcriptions", data={"file": "x"}).json()  # urlencoded: read as a form
    assert text["error"]["message"] == "Expected 'file' to be a file-like object, not 'str'."


def sent(sim: RunningSim, raw: bytes, content_type: str, path: str = "/v1/audio/transcriptions") -> httpx.Response:
    return sim.client.post(path, content=raw, headers={"content-type": content_type})


def part(name: str, value: bytes, head: bytes = b"", filename: str | None = None) -> bytes:
    extra = b'; filename="%s"' % filename.encode() if filename is not None else b""
    return b'--b\r\n%sContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n' % (head, name.encode(), extra, value)


def test_the_form_is_read_as_vllm_reads_it_the_last_header_and_the_last_repeated_field(sim032: RunningSim) -> None:
    """python-multipart keeps a part's last Content-Disposition; FastAPI binds a field to its last part, a list field
    to all of them, and keeps aside the parts the model does not name."""
    raw = b"".join([
        part("temperature", b"7", b'Content-Disposition: form-data; name="temperature"\r\n'.replace(b"temperature",
             b"max_completion_tokens")),
        part("n", b"1"), part("n", b"3"), part("timestamp_granularities[]", b"word"),
        part("timestamp_granularities[]", b"segment"), part("max_tokens", b"99"),
        part("file", wav(0.5), filename="a.wav"), b"--b--\r\n",
    ])  # fmt: skip
    before = sim032.stats.snapshot()["tokens_generated"]
    response = sent(sim032, raw, "multipart/form-data; boundary=b")
    assert response.status_code == 200, response.text
    recorded = sim032.stats.snapshot()["requests"][-1]
    assert recorded["form"] == {"temperature": "7", "n": "3", "timestamp_granularities[]": ["word", "segment"]}
    assert sim032.stats.snapshot()["tokens_generated"] - before == 2048  # 7 was the limit of no field vLLM reads
    assert recorded["file_bytes"] == len(wav(0.5))


def test_a_charset_in_the_content_type_decides_how_vllm_decodes_the_fields(sim032: RunningSim) -> None:
    raw = part("prompt", "é".encode()) + part("file", wav(0.5), filename="a.wav") + b"--b--\r\n"
    assert sent(sim032, raw, "multipart/form-data; boundary=b; charset=latin-1").status_code == 200
    assert sim032.stats.snapshot()["requests"][-1]["form"] == {"prompt": "Ã©"}  # UTF-8 bytes read as Latin-1


@pytest.mark.parametrize(
    ("data", "status", "fragment"),
    [
        ({"max_completion_tokens": "1_0"}, 200, ""),  # pydantic's int: underscores, and "3.0" is 3
        ({"max_completion_tokens": "3.0"}, 200, ""),
        ({"max_completion_tokens": ""}, 400, "unable to parse string as an integer"),  # "" is no absent field
        ({"stream": " true"}, 400, "Input should be a valid boolean"),  # no whitespace around a boolean
        ({"stream": "false", "stream_include_usage": "true"}, 200, ""),  # vLLM's check reads "false" as set
    ],
)
def test_field_values_are_read_as_pydantic_reads_them(
    sim032: RunningSim, data: dict[str, str], status: int, fragment: str
) -> None:
    response = post(sim032, "/v1/audio/transcriptions", data)
    assert response.status_code == status and fragment in response.text
