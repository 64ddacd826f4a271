"""The decision for audio transcription and translation: the prompt is audio, which the guard cannot count, and which
vLLM counts for no one before it runs (no endpoint renders an audio request's prompt; only a stream's usage, after
the fact, says what it was). So the guard says `partial`, counts 0 prompt tokens, and decides on the output alone.

    limit   max_completion_tokens; over the API key's max_output_tokens it is rewritten to that cap in the form
            (only that field's bytes change); over the window it is left for vLLM, which never generates more than
            max_model_len tokens here; absent, policy.default_max_tokens or the key's cap is added to the form, else
            vLLM generates up to the window (or its model's generation config)
    cost    the output limit (the window when none is set), for each beam under beam search: what the request can
            hold. A model that splits long audio into 30-second chunks runs each chunk with that limit; the guard
            cannot know how many there are without decoding the audio.
"""

from __future__ import annotations

from proxy.api.audio import LIMIT_FIELD, AudioRequest
from proxy.policy.decide import Limits
from proxy.policy.outcome import Decision, Forward, Outcome


def settle_audio(req: AudioRequest, raw: bytes, limits: Limits) -> Outcome:
    window, cap = limits.max_model_len, limits.max_output
    asked = req.max_completion_tokens
    body = raw
    if asked is None:
        unsaid = limits.unsaid_output(limits.cap(window))
        if unsaid is not None:
            asked = min(unsaid, window)
            body = req.form.with_field(raw, LIMIT_FIELD, str(asked))
    elif cap is not None and asked > cap:
        asked = cap
        body = req.form.with_field(raw, LIMIT_FIELD, str(cap))
    limit = None if asked is None else min(asked, window)
    return Forward(body, Decision("partial", 0, limit), (limit or window) * req.beams)
