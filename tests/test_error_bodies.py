"""Every error body the guard sends comes from proxy/error_bodies.py: what it writes, byte for byte, and that no
other module of proxy/ builds an envelope of its own (the simulator, which plays vLLM, is a package of its own)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import httptools
import pytest

from proxy import error_bodies
from proxy.error_bodies import Envelope
from proxy.errors import (
    ContextLengthExceeded,
    GuardError,
    GuardUnavailable,
    HeaderTooLarge,
    InvalidRequest,
    TooBusy,
    UpstreamFailed,
    UpstreamUnavailable,
)

PACKAGE = Path(__file__).resolve().parents[1] / "proxy"
WRITER = PACKAGE / "error_bodies.py"
EXEMPT = [WRITER]
# An envelope spelled out in a string: OpenAI's `{"error": ...`, Anthropic's `"type": "error"`, its `event: error`,
# or the status line of a raw reply written to a socket.
ENVELOPE_TEXT = re.compile(r'\{\s*\\?"error\\?"\s*:|\\?"type\\?"\s*:\s*\\?"error\\?"|event:\s*error|HTTP/1\.[01] ')


def envelope_sites(path: Path) -> list[str]:
    """`path:line` of every place `path` builds an error envelope: a dict literal or dict() call with an "error" key
    or "type": "error", or a string or bytes literal (docstrings aside) that spells one out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {key.value: value for key, value in zip(node.keys, node.values, strict=True)
                    if isinstance(key, ast.Constant)}  # fmt: skip
            kind = keys.get("type")
            found = "error" in keys or (isinstance(kind, ast.Constant) and kind.value == "error")
        elif isinstance(node, ast.Call):
            named = isinstance(node.func, ast.Name) and node.func.id == "dict"
            found = named and any(keyword.arg == "error" for keyword in node.keywords)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in docstrings:
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            found = bool(ENVELOPE_TEXT.search(text))
        else:
            found = False
        if found:
            lines.append(f"{path}:{getattr(node, 'lineno', '?')}")
    return lines


def test_no_module_but_the_writer_builds_an_error_envelope() -> None:
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if not any(p.is_relative_to(e) for e in EXEMPT)]
    sites = [site for module in modules for site in envelope_sites(module)]
    assert modules and not sites, "error envelopes built outside proxy/error_bodies.py:\n" + "\n".join(sites)


VIOLATIONS = [
    'def f(e):\n    return {"error": {"message": e}}\n',
    'def f(e):\n    return {"type": "error", "error": e}\n',
    "def f(e):\n    return dict(error=e)\n",
    'RAW = b\'{"error": {"message": "x"}}\'\n',
    'EVENT = "event: error\\ndata: "\n',
    "def f(e):\n    return f'{{\"error\": {e}}}'\n",
    "def f(e, body):\n    return f'HTTP/1.1 {e.status} Bad\\r\\n\\r\\n'.encode() + body\n",
]


@pytest.mark.parametrize("source", VIOLATIONS)
def test_the_scan_names_the_file_and_line_of_an_envelope(tmp_path: Path, source: str) -> None:
    module = tmp_path / "bad.py"
    module.write_text('"""A docstring may say {"error": ...} freely."""\n\nimport json\n' + source)
    sites = envelope_sites(module)
    assert sites and all(site.startswith(f"{module}:") for site in sites)
    assert int(sites[0].rsplit(":", 1)[1]) >= 4  # the line of the violation, not the docstring's


def test_the_scan_leaves_reading_an_upstream_error_alone(tmp_path: Path) -> None:
    module = tmp_path / "fine.py"
    module.write_text('def f(answer, head):\n    return answer.get("error") or head.startswith(b\'data: {"error"\')\n')
    assert envelope_sites(module) == []


def test_openai_envelope_as_a_whole_answer() -> None:
    error = ContextLengthExceeded("too long: é", param="messages")
    assert (
        error_bodies.json_bytes(error)
        == (
            '{"error":{"message":"too long: é","type":"BadRequestError","param":"messages",'
            '"code":"context_length_exceeded"}}'
        ).encode()
    )


def test_anthropic_envelope_as_a_whole_answer() -> None:
    body = json.loads(error_bodies.json_bytes(InvalidRequest("no messages"), Envelope.ANTHROPIC))
    assert body == {"type": "error", "error": {"type": "BadRequestError", "message": "no messages"}}


def test_a_429_answer_tells_when_to_retry_beside_the_given_headers() -> None:
    headers, body = error_bodies.answer(TooBusy("full", retry_after_s=7), [(b"x-request-id", b"r1")])
    assert headers == [(b"x-request-id", b"r1"), (b"retry-after", b"7")]
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    assert error_bodies.answer(InvalidRequest("bad"))[0] == []


def test_an_openai_stream_ends_with_vllms_error_event_then_done() -> None:
    event = error_bodies.stream_event(UpstreamUnavailable("reset"))
    assert event == (
        b'data: {"error": {"message": "reset", "type": "BadGatewayError", "param": null, "code": 502}}\n\n'
        b"data: [DONE]\n\n"
    )


def test_a_messages_stream_ends_with_anthropics_error_event_and_no_done() -> None:
    event = error_bodies.stream_event(UpstreamUnavailable("reset"), Envelope.ANTHROPIC)
    name, data = event.removesuffix(b"\n\n").split(b"\n")
    assert name == b"event: error" and b"[DONE]" not in event
    assert json.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {"type": "BadGatewayError", "message": "reset"},
    }


def test_the_upstreams_own_error_is_relayed_as_it_said_it() -> None:
    said = {"error": {"message": "engine dead", "type": "InternalServerError", "param": None, "code": 500}}
    event = error_bodies.relayed_event(said)
    assert event.endswith(b"\n\ndata: [DONE]\n\n") and json.loads(event.split(b"\n\n")[0][6:]) == said


class Parsed:
    """What httptools reads of a response."""

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body


@pytest.mark.parametrize("error", [HeaderTooLarge("headers too large"), InvalidRequest("not HTTP")])
def test_the_protocol_layers_raw_reply_is_a_whole_http_response_that_closes(error: GuardError) -> None:
    raw = error_bodies.raw_reply(error)
    parsed = Parsed()
    parser = httptools.HttpResponseParser(parsed)
    parser.feed_data(raw)
    assert parser.get_status_code() == error.status
    assert raw.startswith(f"HTTP/1.1 {error.status} ".encode())
    assert parsed.headers[b"connection"] == b"close" and parsed.headers[b"content-type"] == b"application/json"
    assert int(parsed.headers[b"content-length"]) == len(parsed.body)
    assert parsed.body == error_bodies.json_bytes(error)


@pytest.mark.parametrize(("status", "kind"), [(500, "InternalServerError"), (503, "ServiceUnavailableError"),
                                              (507, "InternalServerError"), (404, "NotFoundError"),
                                              (422, "BadRequestError")])  # fmt: skip
def test_an_upstream_failure_takes_the_upstreams_status_and_its_name(status: int, kind: str) -> None:
    body = json.loads(error_bodies.json_bytes(UpstreamFailed("it broke", status)))["error"]
    assert (body["type"], body["code"], body["message"]) == (kind, status, "it broke")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("no messages"), "invalid_request_error"),
        (TooBusy("full", retry_after_s=1), "rate_limit_error"),
        (GuardUnavailable("starting", 1, "not_ready"), "overloaded_error"),
        (UpstreamUnavailable("reset"), "api_error"),
    ],
)
def test_from_vllm_033_the_messages_api_names_anthropics_types(error: GuardError, kind: str) -> None:
    whole = json.loads(error_bodies.json_bytes(error, Envelope.ANTHROPIC_TYPES))
    assert whole == {"type": "error", "error": {"type": kind, "message": error.message}}
    event = error_bodies.stream_event(error, Envelope.ANTHROPIC_TYPES)
    name, data = event.removesuffix(b"\n\n").split(b"\n")
    assert name == b"event: error" and json.loads(data.removeprefix(b"data: ")) == whole


def test_anthropics_types_are_vllm_033s_table() -> None:
    """Every status vLLM 0.33's translate_error_type names, and its fallbacks either side of 500."""
    assert {status: error_bodies.anthropic_type(status) for status in (400, 401, 403, 404, 413, 422, 429, 500, 501,
            503, 504)} == {  # fmt: skip
        400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
        413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
        501: "api_error", 503: "overloaded_error", 504: "api_error",
    }  # fmt: skip
