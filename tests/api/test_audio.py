"""The audio request: the fields that set the output limit and the cost, read strictly from the form."""

from __future__ import annotations

import httpx
import pytest

from proxy.api.audio import audio_request
from proxy.errors import InvalidRequest


def form(data: dict[str, str], with_file: bool = True) -> tuple[bytes, str]:
    files = {"file": ("a.wav", b"RIFF....", "audio/wav")} if with_file else {"other": ("b.bin", b"x", "a/b")}
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def test_the_settings_that_change_the_limit_and_the_cost() -> None:
    req = audio_request(*form({"model": "whisper", "max_completion_tokens": " 64 ", "stream": "True",
                               "use_beam_search": "yes", "n": "3"}))  # fmt: skip
    assert (req.model, req.max_completion_tokens, req.beams, req.stream) == ("whisper", 64, 3, True)


def test_defaults_and_n_without_beam_search() -> None:
    req = audio_request(*form({"n": "4", "model": "", "max_completion_tokens": ""}))  # FastAPI: "" is unset
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
        audio_request(*form(data))


def test_a_form_without_the_audio_file_is_a_400() -> None:
    with pytest.raises(InvalidRequest, match="no `file` part") as caught:
        audio_request(*form({"model": "w"}, with_file=False))
    assert caught.value.param == "file"
    request = httpx.Request("POST", "http://x/", data={"file": "not a file"}, files={"x": ("x", b"", "a/b")})
    with pytest.raises(InvalidRequest, match="no `file` part"):
        audio_request(request.read(), request.headers["content-type"])
