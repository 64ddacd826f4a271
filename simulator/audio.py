"""POST /v1/audio/transcriptions and /v1/audio/translations, as vLLM 0.31 / 0.32 answer them for a speech-to-text
model: the multipart form read as vLLM reads it (Starlette's `Request.form()` on python-multipart, then FastAPI's
`Form()` binding: each field of the request model by its alias, the last of a repeated part, a list field's every
part, the parts it does not name kept aside and ignored), WAV audio only (the stdlib reads it; vLLM reads more
formats), min(max_completion_tokens, max_model_len) tokens of filler (the window when absent: vLLM counts no prompt
against it here), a JSON `{"text", "usage": {"type": "duration", "seconds"}}` (translations: `{"text"}`), or
`transcription.chunk` / `translation.chunk` events, with usage only when `stream_include_usage` is true. Its prompt
tokens, which only a stream's usage tells: Whisper's four task tokens, the text `prompt`, and one token per 10 ms of
audio (its log-mel frames, as vLLM counts them)."""

from __future__ import annotations

import io
import math
import re
import time
import wave
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from simulator.context import Context, response_id
from simulator.errors import ApiError, request_validation_error, validation_error
from simulator.responses import DONE, short_usage, sse

Task = Literal["transcribe", "translate"]
_COMMON = (
    "model", "prompt", "response_format", "language", "hotwords", "to_language", "stream", "stream_include_usage",
    "stream_continuous_usage_stats", "vllm_xargs", "use_beam_search", "n", "length_penalty",
    "include_stop_str_in_output", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
    "repetition_penalty", "presence_penalty", "max_completion_tokens", "watermarking",  # watermarking: 0.32
)  # fmt: skip
LISTS = frozenset({"timestamp_granularities[]"})
FIELDS: dict[Task, frozenset[str]] = {  # the text fields of vLLM's TranscriptionRequest, TranslationRequest (aliases)
    "transcribe": frozenset({*_COMMON, *LISTS}),
    "translate": frozenset(_COMMON),
}
TASK_TOKENS = 4  # <|startoftranscript|><|lang|><|task|><|notimestamps|>
FRAMES_PER_SECOND = 100  # 16 kHz audio, a hop of 160 samples
FORMATS = ("json", "text")
_TRUE, _FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}
_INTEGER = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0*)?")  # pydantic's lax int from a string (3.0 is 3)

Fields = dict[str, str | list[str]]


@dataclass(frozen=True)
class Heard:
    """A form as vLLM's request model holds it: its fields' text (bound as FastAPI binds them) and the audio."""

    fields: Fields
    audio: bytes


@dataclass(frozen=True)
class Spoken:
    """A request read and decided: what it records, what it answers."""

    task: Task
    fields: Fields
    file_bytes: int
    seconds: float
    prompt_tokens: int
    output: list[tuple[int, str]]  # each generated token's id and text
    stream: bool
    include_usage: bool
    response_id: str
    model: str


async def hear(request: Request, task: Task) -> Heard:
    """The form read by Starlette (python-multipart) and bound as FastAPI's Form() binds vLLM's request model."""
    try:
        form = await request.form()
    except HTTPException as exc:  # python-multipart's MultiPartException, as Starlette raises it
        raise ApiError(str(exc.detail), type="Bad Request") from None
    try:
        return Heard(_bound(form, FIELDS[task]), await _audio(form))
    finally:
        await form.close()


def plan_audio(ctx: Context, heard: Heard, task: Task, headers: Mapping[str, str]) -> Spoken:
    fields = heard.fields
    model = _text(fields, "model")
    ctx.check_model(model or None)
    options = [name for name in ("stream_include_usage", "stream_continuous_usage_stats") if fields.get(name)]
    if options and not fields.get("stream"):  # vLLM's "before" validator, on the form's strings ("false" is true)
        raise validation_error("Stream options can only be defined when `stream=True`.", parameter=options[0])
    stream, usage = _flag(fields, "stream"), _flag(fields, "stream_include_usage")
    if stream and _flag(fields, "use_beam_search"):
        raise ApiError("Streaming is not currently supported with beam search")
    if (_text(fields, "response_format") or "json") not in FORMATS:
        raise ApiError("Currently only support response_format: `text`, `json`, `verbose_json` or `diarized_json`")
    seconds = _seconds(heard.audio)
    limit = _limit(_text(fields, "max_completion_tokens"), ctx.settings.max_model_len)
    pieces = ctx.tokenizer.pieces
    prompt = TASK_TOKENS + len(ctx.tokenizer.encode(_text(fields, "prompt") or "", False))
    return Spoken(
        task=task, fields=fields, file_bytes=len(heard.audio), seconds=seconds,
        prompt_tokens=prompt + math.ceil(seconds * FRAMES_PER_SECOND), stream=stream, include_usage=usage,
        output=[pieces[k % len(pieces)] for k in range(limit)], response_id=response_id(task, headers, None),
        model=model or ctx.settings.model,
    )  # fmt: skip


def answer(spoken: Spoken) -> dict[str, Any]:
    text = "".join(piece for _, piece in spoken.output)
    if spoken.task == "translate":
        return {"text": text}
    return {"text": text, "usage": {"type": "duration", "seconds": math.ceil(spoken.seconds)}}


def events(spoken: Spoken) -> Iterator[str]:
    head = {"id": spoken.response_id, "object": f"{'transcription' if spoken.task == 'transcribe' else 'translation'}"
            ".chunk", "created": int(time.time()), "model": spoken.model}  # fmt: skip
    for k, (_, piece) in enumerate(spoken.output):
        choice: dict[str, Any] = {"delta": {"content": piece}}
        if k == len(spoken.output) - 1:
            choice.update(finish_reason="length", stop_reason=None)
        yield sse({**head, "choices": [choice]})
    if spoken.include_usage:
        yield sse({**head, "choices": [], "usage": short_usage(spoken.prompt_tokens, len(spoken.output))})
    yield DONE


def _bound(form: FormData, known: frozenset[str]) -> Fields:
    """Each text part vLLM's model names: a list field's every value, another field's last; the file aside."""
    fields: Fields = {}
    for name in dict.fromkeys(form.keys()):
        if name not in known:  # the file, or a part the model does not name
            continue
        values = form.getlist(name)
        if any(isinstance(value, UploadFile) for value in values):
            raise _invalid(name, "string_type", "Input should be a valid string", "<file>")
        texts = [value for value in values if isinstance(value, str)]
        fields[name] = texts if name in LISTS else texts[-1]
    return fields


async def _audio(form: FormData) -> bytes:
    file = form.get("file")
    if file is None:
        raise request_validation_error([str({"type": "missing", "loc": "body.file", "msg": "Field required"})],
                                       param="body.file")  # fmt: skip
    if isinstance(file, str):
        raise ApiError("Expected 'file' to be a file-like object, not 'str'.", status=422, type="Unprocessable Entity")
    return await file.read()


def _text(fields: Fields, name: str) -> str | None:
    value = fields.get(name)
    return value if isinstance(value, str) else None


def _seconds(audio: bytes) -> float:
    try:
        with wave.open(io.BytesIO(audio)) as sound:
            frames: int = sound.getnframes()
            rate: int = sound.getframerate()
    except (wave.Error, EOFError):
        raise ApiError("Invalid or unsupported audio file.") from None
    if rate <= 0:
        raise ApiError("Invalid or unsupported audio file.")
    return frames / rate


def _limit(value: str | None, window: int) -> int:
    """vLLM's get_max_tokens with no prompt: the request's limit, never past the window."""
    if value is None:
        return window
    if not _INTEGER.fullmatch(value.strip()):
        raise _invalid("max_completion_tokens", "int_parsing",
                       "Input should be a valid integer, unable to parse string as an integer", value)  # fmt: skip
    limit = min(int(value.strip().replace("_", "").split(".")[0]), window)
    if limit < 1:
        raise validation_error(f"max_tokens must be at least 1, got {limit}.", parameter="max_tokens", value=limit)
    return limit


def _flag(fields: Fields, name: str) -> bool:
    value = _text(fields, name)
    if value is None:
        return False
    if value.lower() not in _TRUE | _FALSE:  # pydantic takes no whitespace around a boolean
        raise _invalid(name, "bool_parsing", "Input should be a valid boolean, unable to interpret input", value)
    return value.lower() in _TRUE


def _invalid(name: str, kind: str, message: str, value: str) -> ApiError:
    error = {"type": kind, "loc": f"body.{name}", "msg": message, "input": value}
    return request_validation_error([str(error)], param=f"body.{name}")
