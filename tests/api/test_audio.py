"""The audio request: the fields that set the output limit and the cost, read strictly from the form, and the parts
refused where vLLM's reading of them could differ from the guard's."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from proxy.api.audio import audio_request
from proxy.errors import InvalidRequest

TRANSCRIPTIONS, TRANSLATIONS = "/v1/audio/transcriptions", "/v1/audio/translations"
WAV = {"file": ("a.wav", b"RIFF....", "audio/wav")}


def form(data: dict[str, Any], files: Any = None) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=data, files=WAV if files is None else files)
    return request.read(), request.headers["content-type"]


def test_the_settings_that_change_the_limit_and_the_cost() -> None:
    req = audio_request(*form({"model": "whisper", "max_completion_tokens": " 64 ", "stream": "True",
                               "use_beam_search": "yes", "n": "3"}), TRANSCRIPTIONS)  # fmt: skip
    assert (req.model, req.max_completion_tokens, req.beams, req.stream) == ("whisper", 64, 3, True)


def test_defaults_and_n_without_beam_search() -> None:
    req = audio_request(*form({"n": "4", "model": "", "max_completion_tokens": ""}), TRANSLATIONS)
    assert (req.model, req.max_completion_tokens, req.beams, req.stream) == (None, None, 1, False)


@pytest.mark.parametrize(
    "data,fragment",
    [
        ({"max_completion_tokens": "12.5"}, "'max_completion_tokens' must be an integer"),
        ({"max_completion_tokens": "-3"}, "'max_completion_tokens' must be at least 0"),
        ({"max_completion_tokens": "1e3"}, "must be an integer"),
        ({"n": "0", "use_beam_search": "true"}, "'n' must be at least 1"),
        ({"stream": "maybe"}, "'stream' must be a boolean"),
    ],
)
def test_bad_fields_are_400s(data: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        audio_request(*form(data), TRANSCRIPTIONS)


def test_a_form_without_the_audio_file_is_a_400() -> None:
    raw = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nw\r\n--b--\r\n'
    with pytest.raises(InvalidRequest, match="no `file` part") as caught:
        audio_request(raw, "multipart/form-data; boundary=b", TRANSCRIPTIONS)
    assert caught.value.param == "file"


@pytest.mark.parametrize(
    ("path", "data", "files", "param", "fragment"),
    [
        (TRANSCRIPTIONS, {"max_tokens": "5"}, None, "max_tokens", "is not a field of this endpoint's request in vLLM"),
        (TRANSCRIPTIONS, {"include[]": "logprobs"}, None, "include[]", "token-guard forwards only the fields vLLM"),
        (TRANSLATIONS, {"timestamp_granularities[]": "word"}, None, "timestamp_granularities[]", "not a field"),
        (TRANSCRIPTIONS, {"max_completion_tokens": ["50", "100000"]}, None, "max_completion_tokens",
         "is given more than once; vLLM reads only the last"),
        (TRANSCRIPTIONS, {"model": ["tiny", "other"]}, None, "model", "given more than once"),
        (TRANSCRIPTIONS, {}, [("file", ("a.wav", b"RIFF", "audio/wav")), ("file", ("b.wav", b"RIFF", "audio/wav"))],
         "file", "given more than once"),
        (TRANSCRIPTIONS, {}, {"file": (None, b"not a file")}, "file", "must be the audio, a file part (with a"),
        (TRANSCRIPTIONS, {}, {**WAV, "n": ("n.txt", b"8", "text/plain")}, "n", "must be text, not a file part"),
    ],
    ids=["unknown", "OpenAI's include[]", "a transcription field on translations", "a limit twice", "model twice",
         "two files", "the audio as text", "a setting as a file"],
)  # fmt: skip
def test_parts_vllm_could_read_otherwise_are_refused_by_name(
    path: str, data: dict[str, Any], files: Any, param: str, fragment: str
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(fragment)) as caught:
        audio_request(*form(data, files), path)
    assert caught.value.param == param and repr(param) in caught.value.message


def test_a_list_field_repeats_and_every_field_vllm_knows_is_taken() -> None:
    data = {"timestamp_granularities[]": ["word", "segment"], "vllm_xargs": '{"k": 1}', "watermarking": "false",
            "language": "en", "temperature": "0.2", "response_format": "verbose_json"}  # fmt: skip
    req = audio_request(*form(data), TRANSCRIPTIONS)
    assert [p.value for p in req.form.parts if p.name == "timestamp_granularities[]"] == ["word", "segment"]
