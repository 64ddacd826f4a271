"""The decision for audio transcription and translation: the prompt is audio, which the guard cannot count, and which
vLLM counts for no one before it runs (no endpoint renders an audio request's prompt; only a stream's usage, after
the fact, says what it was). So the guard says `partial`, counts 0 prompt tokens, and decides on the output alone.

    limit   max_completion_tokens; over the API key's max_output_tokens it is set to that cap; over the window it is
            left for vLLM, which never generates more than max_model_len tokens here; absent, policy.default_max_tokens
            or the key's cap is added, else vLLM generates up to the window (or its model's generation config)
    cost    the output limit (the window when none is set), for each beam under beam search: what the request can
            hold; with admission.max_inflight_tokens, a limit is set (or lowered) so that it fits the whole budget.
            A model that splits long audio into 30-second segments runs each segment with that limit; the guard cannot
            know how many there are without decoding the audio.

The form is forwarded as Form.canonical gives it (api/form.py): written anew with the limit set there, or as it came
when nothing changed and the client wrote it as the guard writes one; always with the guard's Content-Type.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.api.audio import LIMIT_FIELD, AudioRequest, audio_request
from proxy.errors import RequestTooLarge
from proxy.policy.decide import Action, Limits
from proxy.policy.outcome import Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.steps import Steps


def decide_audio(req: AudioRequest, raw: bytes, limits: Limits) -> Outcome:
    window, cap = limits.max_model_len, limits.max_output
    asked = req.max_completion_tokens
    changes: dict[str, str] = {}
    if asked is None:
        unsaid = limits.unsaid_output(limits.cap(window))
        if unsaid is not None:
            asked = min(unsaid, window)
            changes[LIMIT_FIELD] = str(asked)
    elif cap is not None and asked > cap:
        asked = cap
        changes[LIMIT_FIELD] = str(cap)
    limit = None if asked is None else min(asked, window)
    budget = limits.max_cost // req.beams if limits.max_cost is not None else window
    if (limit or window) > budget:  # what it can hold is more than the whole KV budget: set the limit that fits
        if budget < limits.min_output_tokens:
            error = RequestTooLarge(
                f"This request's {req.beams} beams need more than the upstream's whole admission budget of "
                f"{limits.max_cost} tokens (admission.max_inflight_tokens): it could never be admitted.",
                param="n",
            )
            return Refuse(error, Decision(Action.REJECT, 0))
        limit, changes[LIMIT_FIELD] = budget, str(budget)
    body, content_type = req.form.canonical(raw, changes)
    return Forward(body, Decision(Action.PARTIAL, 0, limit), (limit or window) * req.beams, content_type)


def audio(steps: Steps, path: str, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
    """Transcription and translation, read from their multipart form: the output limit decided, the audio uncounted."""
    req = audio_request(raw, headers.get("content-type", ""), path)
    findings.max_tokens_before = req.max_completion_tokens
    limits = steps.target(req.model, headers, findings).limits
    return decide_audio(req, raw, limits)
