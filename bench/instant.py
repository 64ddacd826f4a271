"""An OpenAI-compatible upstream that answers at once, so that whatever stands in front of it is the bottleneck: a fixed
579-byte `chat.completion`, or a stream of `max_tokens` `chat.completion.chunk` events (16 unless asked) and
`data: [DONE]`. A raw ASGI function under uvicorn with uvloop and httptools; nothing is parsed but two regexes.

`python -m bench.instant --port 9000 [--workers 2]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MODEL = "tiny"
MAX_MODEL_LEN = 40960
COMPLETION_BYTES = 579
DEFAULT_CHUNKS = 16
MAX_CHUNKS = 4096
STREAM = re.compile(rb'"stream"\s*:\s*true')
MAX_TOKENS = re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)')
TEXT = "The quick brown fox jumps over the lazy dog, and then it rests under the old oak tree. " * 8
ID, CREATED = "chatcmpl-instant0123456789abcdef", 1764633600


def completion(size: int = COMPLETION_BYTES) -> bytes:
    """A vLLM-shaped non-stream answer, its content cut so the whole body is exactly `size` bytes."""
    answer: dict[str, Any] = {
        "id": ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "", "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 64, "total_tokens": 80, "completion_tokens": 16},
        "prompt_logprobs": None,
    }
    room = size - len(json.dumps(answer, separators=(",", ":")))
    answer["choices"][0]["message"]["content"] = TEXT[:room]
    return json.dumps(answer, separators=(",", ":")).encode()


def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {"id": ID, "object": "chat.completion.chunk", "created": CREATED, "model": MODEL, "choices": [choice]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


BODY = completion()
FIRST = chunk({"role": "assistant", "content": "The"})
MIDDLE = chunk({"content": " fox"})
LAST = chunk({"content": "."}, "length")
DONE = b"data: [DONE]\n\n"
MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench", "max_model_len": MAX_MODEL_LEN}]}
).encode()


def _headers(content_type: bytes, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type)]
    return headers + [(b"content-length", str(length).encode())] if length is not None else headers


JSON_HEADERS = _headers(b"application/json", len(BODY))
SSE_HEADERS = _headers(b"text/event-stream; charset=utf-8")


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    while message.get("more_body"):
        message = await receive()
        body += message.get("body", b"")
    return body


async def _stream(send: Send, chunks: int) -> None:
    """Each event is its own write, and the loop is yielded between events, as a server generating tokens would."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    events = [FIRST, *([MIDDLE] * (chunks - 2)), LAST] if chunks > 1 else [LAST]
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": DONE})


async def _static(send: Send, status: int, body: bytes) -> None:
    headers = _headers(b"application/json", len(body))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return  # lifespan: nothing to start or close
    path = scope["path"]
    if scope["method"] == "POST" and path.endswith("/completions"):
        body = await _read_body(receive)
        if STREAM.search(body):
            asked = MAX_TOKENS.search(body)
            await _stream(send, min(MAX_CHUNKS, max(1, int(asked.group(1)))) if asked else DEFAULT_CHUNKS)
        else:
            await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
            await send({"type": "http.response.body", "body": BODY})
    elif path == "/health":
        await _static(send, 200, b"{}")
    elif path == "/v1/models":
        await _static(send, 200, MODELS)
    else:
        await _static(send, 404, b'{"error":{"message":"not here","type":"NotFoundError","code":404}}')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instant", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes on one port")
    args = parser.parse_args(argv)
    uvicorn.run(
        "bench.instant:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
