"""The audio requests (`POST /v1/audio/transcriptions` and `/v1/audio/translations`) as the guard reads them: a
multipart form (api/form.py) whose `file` part is the audio, never decoded here, and whose text fields hold the
settings. Only the fields that change the output limit or the cost are read; the form is forwarded as sent.

vLLM 0.31 / 0.32 (`speech_to_text/{transcription,translation}/protocol.py`, `base/serving.py`): both forms take
`file` (a file part), `model`, `max_completion_tokens` (both versions, both routes), `stream`, `use_beam_search` and
`n` (beams, used only with beam search), read by pydantic from the form's strings. vLLM generates
min(max_completion_tokens, max_model_len) tokens (max_model_len when it is absent, or less from the model's generation
config), per 30-second chunk of audio for models that split long audio.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.api.form import Form, read_form
from proxy.errors import InvalidRequest

LIMIT_FIELD = "max_completion_tokens"
INTEGER = re.compile(r"[+-]?[0-9]+")
TRUE, FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}  # pydantic's lax booleans


@dataclass(frozen=True)
class AudioRequest:
    form: Form
    model: str | None
    max_completion_tokens: int | None
    beams: int  # sequences the request runs: `n` under beam search, else 1
    stream: bool


def audio_request(raw: bytes, content_type: str) -> AudioRequest:
    form = read_form(raw, content_type)
    audio = form.part("file")
    if audio is None or audio.filename is None:
        raise InvalidRequest("The form has no `file` part holding the audio (a file field, with a filename).",
                             param="file")  # fmt: skip
    fields = form.fields
    limit = _count(fields, LIMIT_FIELD, 0)
    n = _count(fields, "n", 1)
    return AudioRequest(
        form=form, model=fields.get("model") or None, max_completion_tokens=limit,
        beams=(n or 1) if _flag(fields, "use_beam_search") else 1, stream=_flag(fields, "stream"),
    )  # fmt: skip


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
