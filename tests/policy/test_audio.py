"""The audio decision, without a socket: nothing counted, the output limit decided, the form written anew with the
limit set (and every other field and the audio as read)."""

from __future__ import annotations

import httpx

from proxy.api.audio import audio_request
from proxy.policy.audio import decide_audio
from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward

AUDIO = b"RIFF" + bytes(range(256)) * 8
WHISPER = Limits(max_model_len=448)
PATH = "/v1/audio/transcriptions"


def settle(data: dict[str, str], limits: Limits = WHISPER) -> tuple[Forward, dict[str, str]]:
    """The outcome, and the fields of the form it forwards. httpx writes a form as the guard writes one anew: unless a
    field changes, it goes as it came, else written anew in a boundary of the guard's own."""
    request = httpx.Request("POST", "http://x/", data=data, files={"file": ("a.wav", AUDIO, "audio/wav")})
    raw, content_type = request.read(), request.headers["content-type"]
    outcome = decide_audio(audio_request(raw, content_type, PATH), raw, limits)
    assert isinstance(outcome, Forward) and outcome.content_type is not None
    assert (outcome.body is raw) == (outcome.content_type == content_type)
    forwarded = audio_request(outcome.body, outcome.content_type, PATH)
    file = forwarded.form.part("file")
    assert file is not None and file.filename == "a.wav" and outcome.body[file.start : file.end] == AUDIO
    return outcome, forwarded.form.fields


def test_a_limit_is_partial_with_no_prompt_tokens_and_costs_the_limit() -> None:
    outcome, fields = settle({"model": "whisper", "max_completion_tokens": "100"})
    assert fields == {"model": "whisper", "max_completion_tokens": "100"} and outcome.body.startswith(b"--")
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.decision.max_tokens) == ("partial", 0, 100)
    assert outcome.cost == 100 and outcome.decision.headers()["x-token-guard-prompt-tokens"] == "0"


def test_over_the_window_vllm_caps_it_itself_so_the_limit_goes_as_sent() -> None:
    outcome, fields = settle({"max_completion_tokens": "5000"})
    assert fields == {"max_completion_tokens": "5000"} and outcome.decision.max_tokens == 448 and outcome.cost == 448


def test_no_limit_costs_the_window_and_beams_multiply_it() -> None:
    outcome, fields = settle({"use_beam_search": "true", "n": "3"})
    assert fields == {"use_beam_search": "true", "n": "3"}
    assert outcome.decision.max_tokens is None and outcome.cost == 3 * 448


def test_the_keys_cap_changes_only_that_field() -> None:
    outcome, fields = settle({"max_completion_tokens": "300", "language": "en"}, Limits(448, max_output=50))
    assert fields == {"max_completion_tokens": "50", "language": "en"} and outcome.decision.max_tokens == 50
    assert outcome.cost == 50 and b"token-guard-" in outcome.body  # written anew


def test_a_default_or_the_keys_cap_is_added_when_none_is_asked_for() -> None:
    outcome, fields = settle({"model": "w"}, Limits(448, default_max_tokens=64))
    assert fields == {"model": "w", "max_completion_tokens": "64"} and outcome.cost == 64
    outcome, fields = settle({"model": "w"}, Limits(448, max_output=32))
    assert fields["max_completion_tokens"] == "32" and outcome.decision.max_tokens == 32


def test_a_limit_over_the_whole_kv_budget_is_lowered_in_the_form() -> None:
    outcome, fields = settle({"model": "whisper", "max_completion_tokens": "400"}, Limits(448, max_cost=300))
    assert fields["max_completion_tokens"] == "300" and outcome.cost == 300
    unsaid, fields = settle({"model": "whisper"}, Limits(448, max_cost=300))
    assert fields["max_completion_tokens"] == "300" and unsaid.cost == 300
