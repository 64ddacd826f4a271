"""The usage event of a stream whose client did not ask for it: a limited key's chat, completions or token-in
(`/inference/v1/generate`) stream asks vLLM for it (`stream_options.include_usage`), so that the key pays exactly
what vLLM generated, and the client gets the stream it asked for, without that event.

vLLM 0.31 and 0.32 write the same events either way but for two: the usage event (`"choices":[]`, after the last
choice's finish event and before `data: [DONE]`), and the server's `system_fingerprint`, which without the usage
event rides on each choice's finish event and with it on the usage event alone. `HiddenUsage` takes the usage event
out and puts its fingerprint back on the finish events, where vLLM would have written it: last, after the choices
(`ChatCompletionStreamResponse` and `CompletionStreamResponse` declare it after them, and a finish event sets nothing
else). A finish event is therefore held until the usage event says the fingerprint: with `n` > 1 the choices that
finish first reach the client when the last one finishes. A stream that carries usage in other events (vLLM's
`--enable-force-include-usage`, which turns on the usage of every event) is relayed as it comes, its last usage
event included: the client would have had them without the guard too."""

from __future__ import annotations

import json
import re
from typing import Any

FINISH = b'"finish_reason":"'  # a string, not null: a choice's last event
FINGERPRINT = re.compile(rb'"system_fingerprint":("(?:[^"\\]|\\.)*")')
DONE = b"data: [DONE]"
# the keys vLLM's stream response classes declare after `system_fingerprint` (chat: prompt_token_ids, prompt_text,
# then from 0.33 metrics and kv_transfer_params; completions: metrics, kv_transfer_params)
AFTER_FINGERPRINT = frozenset({"prompt_token_ids", "prompt_text", "metrics", "kv_transfer_params"})
_DECODER = json.JSONDecoder()
HOLD_BYTES = 2**22  # an event longer than this is not looked into: the rest of the stream is relayed as it comes


def usage_options(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `stream_options` that ask vLLM for a stream's usage event, for a stream whose client did not ask for it;
    None when it is no stream, asks already, or says something vLLM would refuse (left for vLLM to answer)."""
    if body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") not in (None, False):
        return None
    if options.get("continuous_usage_stats") not in (None, False, True):
        return None
    return {**options, "include_usage": True, "continuous_usage_stats": False}


class HiddenUsage:
    """A stream's bytes as they come, less the usage event the guard asked for (module docstring)."""

    __slots__ = ("_held", "_pending", "_through", "hidden")

    def __init__(self) -> None:
        self._pending = b""
        self._held: list[bytes] = []  # finish events, until the usage event says the fingerprint
        self._through = False  # relay the rest as it comes
        self.hidden = False  # the usage event was taken out

    def feed(self, piece: bytes) -> bytes:
        """What of the stream goes to the client now."""
        if self._through:
            return piece
        if not self._pending and piece.endswith(b"\n\n") and piece.find(b"\n\n") == len(piece) - 2:  # one event
            return self._event(piece[:-2], piece)
        data = self._pending + piece
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return self._overlong()
        self._pending = data[end + 2 :]
        out = [self._event(event, event + b"\n\n") for event in data[:end].split(b"\n\n")]
        if self._through:
            out.append(self._pending)
            self._pending = b""
        return b"".join(out) + self._overlong()

    def end(self) -> bytes:
        """What is left when the stream ends (without its usage event: it broke off, or vLLM sent none)."""
        rest, self._pending = self._released() + self._pending, b""
        return rest

    def _released(self) -> bytes:
        held, self._held = self._held, []
        return b"".join(held)

    def _event(self, event: bytes, whole: bytes) -> bytes:
        """What goes out for one `event` (`whole`: with its blank line)."""
        if self._through:
            return whole
        if event == DONE:
            return self._released() + whole
        if b'"usage":{' in event:
            if not self.hidden and b'"choices":[]' in event:
                self.hidden = True
                found = FINGERPRINT.search(event)
                held, self._held = self._held, []
                return b"".join(_with(e, found.group(1)) if found else e for e in held)
            self._through = True  # usage in other events too: forced by the server, the client gets it all
            return self._released() + whole
        if FINISH in event:
            self._held.append(whole)
            return b""
        return whole

    def _overlong(self) -> bytes:
        if len(self._pending) <= HOLD_BYTES:
            return b""
        self._through = True
        return self.end()


def _with(event: bytes, fingerprint: bytes) -> bytes:
    """A held finish event (its `\\n\\n` included) with the fingerprint where vLLM writes it: before the first of the
    keys its response classes declare after it (0.34 ends a finish event with `kv_transfer_params`), else last."""
    body = event[:-2]
    if not body.endswith(b"}") or b'"system_fingerprint":' in body:
        return event
    at = _first_key_after_fingerprint(body)
    if at is None:
        return body[:-1] + b',"system_fingerprint":' + fingerprint + b"}\n\n"
    return body[:at] + b'"system_fingerprint":' + fingerprint + b"," + body[at:] + b"\n\n"


def _first_key_after_fingerprint(body: bytes) -> int | None:
    """Where the first top-level key of `body` (an event's `data: ` and a compact JSON object) that vLLM serialises
    after `system_fingerprint` begins; None when it has none, or is not such an object."""
    decoder = _DECODER
    try:
        text = body.decode("utf-8")
        at = text.index("{") + 1
        while at < len(text) - 1:
            key, end = decoder.raw_decode(text, at)
            if not isinstance(key, str):
                return None
            if key in AFTER_FINGERPRINT:
                return len(text[:at].encode("utf-8"))
            if text[end] != ":":
                return None
            _, at = decoder.raw_decode(text, end + 1)
            if text[at] != ",":
                return None
            at += 1
    except (ValueError, IndexError):
        return None
    return None
