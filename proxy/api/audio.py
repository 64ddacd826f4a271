"""The audio requests (`POST /v1/audio/transcriptions` and `/v1/audio/translations`) as the guard reads them: a
multipart form (api/form.py) whose `file` part is the audio, never decoded here, and whose text fields hold the
settings. Only the fields that change the output limit or the cost are read; the form goes upstream as
Form.canonical gives it (written anew from what was read, or as it came when it already was that form), so that vLLM
reads what the guard read.

vLLM 0.31 / 0.32 (`speech_to_text/{transcription,translation}/protocol.py`, `base/serving.py`): both forms take
`file` (a file part), `model`, `max_completion_tokens` (both versions, both routes), `stream`, `use_beam_search` and
`n` (beams, used only with beam search), read by pydantic from the form's strings. vLLM generates
min(max_completion_tokens, max_model_len) tokens (max_model_len when it is absent, or less from the model's generation
config), per 30-second chunk of audio for models that split long audio.

FastAPI binds each field of the request model by its alias with `FormData.get`, the last of a repeated part, and a
list field (`timestamp_granularities[]`) with `getlist`; a part the model does not name is kept as an extra, which
vLLM ignores. A form is refused, naming the part, where that reading could differ from the guard's: a field read once
that comes twice, a part the route's model does not name, the audio in a text part or a setting in a file part.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from proxy.api.form import Form, read_form
from proxy.errors import InvalidRequest

LIMIT_FIELD = "max_completion_tokens"
INTEGER = re.compile(r"[+-]?[0-9]+")
TRUE, FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}  # pydantic's lax booleans
_COMMON = (
    "file", "model", "prompt", "response_format", "language", "hotwords", "to_language", "stream",
    "stream_include_usage", "stream_continuous_usage_stats", "vllm_xargs", "use_beam_search", "n", "length_penalty",
    "include_stop_str_in_output", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
    "repetition_penalty", "presence_penalty", "max_completion_tokens", "watermarking",  # watermarking: 0.32
)  # fmt: skip
LISTS = frozenset({"timestamp_granularities[]"})  # a part per item
FIELDS = {  # every part vLLM 0.31 / 0.32's request model names (its fields' aliases), by route
    "/v1/audio/transcriptions": frozenset({*_COMMON, *LISTS}),
    "/v1/audio/translations": frozenset(_COMMON),
}


@dataclass(frozen=True)
class AudioRequest:
    form: Form
    model: str | None
    max_completion_tokens: int | None
    beams: int  # sequences the request runs: `n` under beam search, else 1
    stream: bool


def audio_request(raw: bytes, content_type: str, path: str) -> AudioRequest:
    form = read_form(raw, content_type)
    _check_parts(form, FIELDS[path])
    fields = form.fields
    limit = _count(fields, LIMIT_FIELD, 0)
    n = _count(fields, "n", 1)
    return AudioRequest(
        form=form, model=fields.get("model") or None, max_completion_tokens=limit,
        beams=(n or 1) if _flag(fields, "use_beam_search") else 1, stream=_flag(fields, "stream"),
    )  # fmt: skip


def _check_parts(form: Form, known: frozenset[str]) -> None:
    for part in form.parts:
        if part.name not in known:
            raise InvalidRequest(f"The form part {part.name!r} is not a field of this endpoint's request in vLLM, "
                                 "which would ignore it; token-guard forwards only the fields vLLM reads.",
                                 param=part.name)  # fmt: skip
        if (part.name == "file") != (part.filename is not None):
            which = "the audio, a file part (with a filename)" if part.name == "file" else "text, not a file part"
            raise InvalidRequest(f"The form part {part.name!r} must be {which}.", param=part.name)
    repeated = [name for name, times in Counter(p.name for p in form.parts).items() if times > 1 and name not in LISTS]
    if repeated:
        raise InvalidRequest(f"The form part {repeated[0]!r} is given more than once; vLLM reads only the last, and "
                             "token-guard reads such a field only once.", param=repeated[0])  # fmt: skip
    if form.part("file") is None:
        raise InvalidRequest("The form has no `file` part holding the audio (a file field, with a filename).",
                             param="file")  # fmt: skip


def _count(fields: dict[str, str], name: str, least: int) -> int | None:
    value = fields.get(name)
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    if not INTEGER.fullmatch(text):
        raise InvalidRequest(f"The form field '{name}' must be an integer, got {value[:40]!r}.", param=name)
    number = int(text)
    if number < least:
        raise InvalidRequest(f"The form field '{name}' must be at least {least}, got {number}.", param=name)
    return number


def _flag(fields: dict[str, str], name: str) -> bool:
    value = fields.get(name)
    if value is None or value.strip() == "":
        return False
    text = value.strip().lower()
    if text not in TRUE | FALSE:
        raise InvalidRequest(f"The form field '{name}' must be a boolean (true or false), got {value[:40]!r}.",
                             param=name)  # fmt: skip
    return text in TRUE
