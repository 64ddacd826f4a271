"""POST /v1/audio/transcriptions and /v1/audio/translations, as vLLM 0.31 / 0.32 answer them for a speech-to-text
model: a multipart form (read with the guard's own strict reader), WAV audio only (the stdlib reads it; vLLM reads
more formats), min(max_completion_tokens, max_model_len) tokens of filler (the window when absent: vLLM counts no
prompt against it here), a JSON `{"text", "usage": {"type": "duration", "seconds"}}` (translations: `{"text"}`), or
`transcription.chunk` / `translation.chunk` events, with usage only when `stream_include_usage` is true. Its prompt
tokens, which only a stream's usage tells: Whisper's four task tokens, the text `prompt`, and one token per 10 ms of
audio (its log-mel frames, as vLLM counts them)."""

from __future__ import annotations

import io
import math
import time
import wave
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.api.form import Form, read_form
from proxy.errors import InvalidRequest
from proxy.simulator.context import Context, response_id
from proxy.simulator.errors import ApiError, request_validation_error, validation_error
from proxy.simulator.responses import DONE, short_usage, sse

Task = Literal["transcribe", "translate"]
TASK_TOKENS = 4  # <|startoftranscript|><|lang|><|task|><|notimestamps|>
FRAMES_PER_SECOND = 100  # 16 kHz audio, a hop of 160 samples
FORMATS = ("json", "text")


@dataclass(frozen=True)
class Spoken:
    """A request read and decided: what it records, what it answers."""

    task: Task
    fields: dict[str, str]
    file_bytes: int
    seconds: float
    prompt_tokens: int
    output: list[tuple[int, str]]  # each generated token's id and text
    stream: bool
    include_usage: bool
    response_id: str
    model: str


def plan_audio(ctx: Context, raw: bytes, content_type: str, task: Task, headers: Mapping[str, str]) -> Spoken:
    form = _form(raw, content_type)
    fields = form.fields
    ctx.check_model(fields.get("model") or None)
    stream, usage = _flag(fields, "stream"), _flag(fields, "stream_include_usage")
    if usage and not stream:
        raise validation_error("Stream options can only be defined when `stream=True`.",
                               parameter="stream_include_usage")  # fmt: skip
    if stream and _flag(fields, "use_beam_search"):
        raise ApiError("Streaming is not currently supported with beam search")
    if fields.get("response_format", "json") not in FORMATS:
        raise ApiError("Currently only support response_format: `text`, `json`, `verbose_json` or `diarized_json`")
    seconds = _seconds(raw, form)
    limit = _limit(fields.get("max_completion_tokens"), ctx.settings.max_model_len)
    pieces = ctx.tokenizer.pieces
    prompt = TASK_TOKENS + len(ctx.tokenizer.encode(fields.get("prompt", ""), False))
    file = form.part("file")
    assert file is not None
    return Spoken(
        task=task, fields=fields, file_bytes=file.end - file.start, seconds=seconds,
        prompt_tokens=prompt + math.ceil(seconds * FRAMES_PER_SECOND), stream=stream, include_usage=usage,
        output=[pieces[k % len(pieces)] for k in range(limit)], response_id=response_id(task, headers, None),
        model=fields.get("model") or ctx.settings.model,
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


def _form(raw: bytes, content_type: str) -> Form:
    try:
        form = read_form(raw, content_type)
    except InvalidRequest as exc:
        raise ApiError(exc.message, type="Bad Request", param=exc.param) from None
    file = form.part("file")
    if file is None:
        raise request_validation_error([str({"type": "missing", "loc": "body.file", "msg": "Field required"})],
                                       param="body.file")  # fmt: skip
    if file.filename is None:
        raise ApiError("Expected 'file' to be a file-like object, not 'str'.", status=422, type="Unprocessable Entity")
    return form


def _seconds(raw: bytes, form: Form) -> float:
    file = form.part("file")
    assert file is not None
    try:
        with wave.open(io.BytesIO(raw[file.start : file.end])) as audio:
            frames: int = audio.getnframes()
            rate: int = audio.getframerate()
    except (wave.Error, EOFError):
        raise ApiError("Invalid or unsupported audio file.") from None
    if rate <= 0:
        raise ApiError("Invalid or unsupported audio file.")
    return frames / rate


def _limit(value: str | None, window: int) -> int:
    """vLLM's get_max_tokens with no prompt: the request's limit, never past the window."""
    if value is None or not value.strip():
        return window
    try:
        asked = int(value.strip())
    except ValueError:
        msg = "Input should be a valid integer, unable to parse string as an integer"
        error = {"type": "int_parsing", "loc": "body.max_completion_tokens", "msg": msg, "input": value}
        raise request_validation_error([str(error)], param="body.max_completion_tokens") from None
    limit = min(asked, window)
    if limit < 1:
        raise validation_error(f"max_tokens must be at least 1, got {limit}.", parameter="max_tokens", value=limit)
    return limit


def _flag(fields: dict[str, str], name: str) -> bool:
    return fields.get(name, "").strip().lower() in ("1", "on", "t", "true", "y", "yes")
