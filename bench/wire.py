"""One timed request to an OpenAI-compatible `/v1/chat/completions`: status, time to first token, total time,
tokens and errors, read from a JSON body or an SSE stream."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

PATH = "/v1/chat/completions"


@dataclass
class Record:
    start: float  # seconds since the run started
    status: int  # HTTP status; 0 when no response came
    total: float | None = None  # seconds, start to the last byte
    ttft: float | None = None  # seconds to the first content chunk (streams) or the whole response
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    chunks: int | None = None  # SSE data events, [DONE] excluded
    error: str | None = None
    turn: int | None = None

    @property
    def end(self) -> float:
        return self.start + (self.total or 0.0)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("start", "total", "ttft"):
            if data[key] is not None:
                data[key] = round(data[key], 6)
        return {k: v for k, v in data.items() if v is not None}


async def send(client: httpx.AsyncClient, stream: bool, body: bytes, t0: float) -> Record:
    start = time.perf_counter()
    record = Record(start=start - t0, status=0)
    try:
        if stream:
            await _stream(client, body, record, start)
        else:
            response = await client.post(PATH, content=body)
            record.status = response.status_code
            record.ttft = record.total = time.perf_counter() - start
            _read_json(response.content, record)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        record.total = time.perf_counter() - start
    return record


def _read_json(content: bytes, record: Record) -> None:
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    if record.status != 200 or not isinstance(data, dict):
        record.error = content[:300].decode(errors="replace") or f"HTTP {record.status}"
        return
    _read_usage(data.get("usage"), record)


def _read_usage(usage: Any, record: Record) -> None:
    if isinstance(usage, dict):
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = usage.get("completion_tokens")


async def _stream(client: httpx.AsyncClient, body: bytes, record: Record, start: float) -> None:
    async with client.stream("POST", PATH, content=body) as response:
        record.status = response.status_code
        if response.status_code != 200:
            _read_json(await response.aread(), record)
            record.total = time.perf_counter() - start
            return
        events = SseCounter()
        async for data in response.aiter_bytes():
            if events.feed(data) and record.ttft is None:
                record.ttft = time.perf_counter() - start
        record.total = time.perf_counter() - start
    record.chunks, record.error = events.count, events.error
    _read_usage(events.usage(), record)
    if record.output_tokens is None:
        record.output_tokens = events.content_chunks


class SseCounter:
    """Counts SSE data events; parses JSON only until the first content arrives and for the last few events (the
    usage chunk), so the client stays cheap next to the servers it measures."""

    def __init__(self) -> None:
        self._pending = b""
        self._tail: list[bytes] = []
        self.count = 0
        self.content_chunks = 0
        self.started = False
        self.error: str | None = None

    def feed(self, data: bytes) -> bool:
        """Take bytes; True once the first content token has been seen."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        *complete, self._pending = (self._pending + data).split(b"\n\n")
        for event in complete:
            self._event(event)
        return self.started

    def _event(self, event: bytes) -> None:
        if not event.startswith(b"data:") or event[5:].strip() == b"[DONE]":
            return
        self.count += 1
        payload = event[5:].strip()
        if b'"error"' in payload[:16]:
            self.error = "stream error: " + payload[:300].decode(errors="replace")
        if not self.started:
            self.started = _has_content(payload)
        if self.started:
            self.content_chunks += 1
        self._tail = [*self._tail[-3:], payload]

    def usage(self) -> Any:
        for payload in reversed(self._tail):
            if b'"usage"' in payload:
                usage = json.loads(payload).get("usage")
                if usage:
                    return usage
        return None


def _has_content(payload: bytes) -> bool:
    try:
        choices = json.loads(payload).get("choices") or []
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") or c.get("text") for c in choices if isinstance(c, dict))
