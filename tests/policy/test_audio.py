"""The audio decision, without a socket: nothing counted, the output limit decided, the form changed only there."""

from __future__ import annotations

import httpx

from proxy.api.audio import audio_request
from proxy.policy.audio import settle_audio
from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward

AUDIO = b"RIFF" + bytes(range(256)) * 8
WHISPER = Limits(max_model_len=448)


def settle(data: dict[str, str], limits: Limits = WHISPER) -> tuple[Forward, bytes, dict[str, str]]:
    request = httpx.Request("POST", "http://x/", data=data, files={"file": ("a.wav", AUDIO, "audio/wav")})
    raw, content_type = request.read(), request.headers["content-type"]
    outcome = settle_audio(audio_request(raw, content_type), raw, limits)
    assert isinstance(outcome, Forward)
    forwarded = audio_request(outcome.body, content_type)
    file = forwarded.form.part("file")
    assert file is not None and outcome.body[file.start : file.end] == AUDIO  # the audio goes as sent
    return outcome, raw, forwarded.form.fields


def test_a_limit_is_partial_with_no_prompt_tokens_and_costs_the_limit() -> None:
    outcome, raw, _ = settle({"model": "whisper", "max_completion_tokens": "100"})
    assert outcome.body == raw
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.decision.max_tokens) == ("partial", 0, 100)
    assert outcome.cost == 100 and outcome.decision.headers()["x-token-guard-prompt-tokens"] == "0"


def test_over_the_window_vllm_caps_it_itself_so_the_form_goes_as_sent() -> None:
    outcome, raw, _ = settle({"max_completion_tokens": "5000"})
    assert outcome.body == raw and outcome.decision.max_tokens == 448 and outcome.cost == 448


def test_no_limit_costs_the_window_and_beams_multiply_it() -> None:
    outcome, raw, _ = settle({"use_beam_search": "true", "n": "3"})
    assert outcome.body == raw and outcome.decision.max_tokens is None and outcome.cost == 3 * 448


def test_the_keys_cap_rewrites_only_that_field() -> None:
    outcome, raw, fields = settle({"max_completion_tokens": "300", "language": "en"}, Limits(448, max_output=50))
    assert fields == {"max_completion_tokens": "50", "language": "en"} and outcome.decision.max_tokens == 50
    assert len(outcome.body) == len(raw) - 1 and outcome.cost == 50


def test_a_default_or_the_keys_cap_is_added_when_none_is_asked_for() -> None:
    outcome, _, fields = settle({"model": "w"}, Limits(448, default_max_tokens=64))
    assert fields["max_completion_tokens"] == "64" and outcome.cost == 64
    outcome, _, fields = settle({"model": "w"}, Limits(448, max_output=32))
    assert fields["max_completion_tokens"] == "32" and outcome.decision.max_tokens == 32


def test_a_limit_over_the_whole_kv_budget_is_lowered_in_the_form() -> None:
    outcome, _, fields = settle({"model": "whisper", "max_completion_tokens": "400"}, Limits(448, max_cost=300))
    assert fields["max_completion_tokens"] == "300" and outcome.cost == 300
    unsaid, _, fields = settle({"model": "whisper"}, Limits(448, max_cost=300))
    assert fields["max_completion_tokens"] == "300" and unsaid.cost == 300
