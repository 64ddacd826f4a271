"""The differential reading of request bodies: the guard's readers against vLLM's own (tests/e2e/test_reading.py).

A `Body` is a request as a client sends it. The guard reads it with its wire model (api/): what it checks, or a
refusal; what it forwards is the body as sent or rewritten (JSON), or the form written anew (api/form.py). vLLM reads
what the guard forwards, and the client's own bytes, with its own routers, FastAPI and request models
(tests/e2e/vllm_reader.py, run in the e2e suite's vLLM environment, no server). `CHECKED` says, for each route, what
the guard checks and where vLLM holds the same: to read another route or another field, add its pair there; to try
another body, add a `Body` to test_reading.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.api.anthropic import messages_request
from proxy.api.audio import audio_request
from proxy.api.body import parse_json_object, with_changes
from proxy.api.chat import chat_request
from proxy.api.completions import completion_request
from proxy.api.pooling import PoolingRequest, pooling_request
from proxy.api.responses import responses_request
from proxy.errors import InvalidRequest
from tests.e2e.runtime import quiet_env, vllm_venv

READER = Path(__file__).with_name("vllm_reader.py")
JSON = "application/json"
CHAT, COMPLETIONS, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"
EMBEDDINGS, TRANSCRIPTIONS, TRANSLATIONS = "/v1/embeddings", "/v1/audio/transcriptions", "/v1/audio/translations"

Checked = dict[str, Any]


@dataclass(frozen=True)
class Body:
    name: str
    path: str
    raw: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()  # more headers, as sent (a second content-type, ...)

    def sent(self) -> list[tuple[str, str]]:
        return [("content-type", self.content_type), *self.headers]


@dataclass(frozen=True)
class GuardRead:
    checked: Checked | None  # None: refused
    refusal: str | None = None
    forwarded: list[tuple[bytes, str]] = field(default_factory=list)  # each body the guard may send, its type


@dataclass(frozen=True)
class VllmRead:
    status: int
    request: dict[str, Any] | None  # the request model's fields as vLLM holds them; None: refused

    @property
    def read(self) -> bool:
        return self.request is not None


def model_of(value: Any) -> str | None:
    return value or None  # vLLM serves the default model for an empty one, as the guard reads it


def prompts(value: Any) -> Any:
    """vLLM's `prompt` or `input` as the guard lists it: one prompt (a string, or token ids) or a batch of them."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)):
        return [value]
    return value


def turns(messages: Any) -> Any:
    """What is counted of each message: its role and content."""
    return [(m.get("role"), m.get("content")) for m in messages] if isinstance(messages, list) else messages


def _chat(body: dict[str, Any], _: str) -> Checked:
    r = chat_request(body)
    return {"model": r.model, "messages": turns(r.messages), "max_tokens": r.max_tokens, "n": r.n,
            "max_completion_tokens": r.max_completion_tokens, "min_tokens": r.min_tokens or None, "stream": r.stream,
            "add_generation_prompt": r.add_generation_prompt, "continue_final_message": r.continue_final_message,
            "add_special_tokens": r.add_special_tokens}  # fmt: skip


def _vllm_chat(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "messages": turns(v["messages"]), "max_tokens": v["max_tokens"],
            "n": v["n"] or 1, "max_completion_tokens": v["max_completion_tokens"],
            "min_tokens": v["min_tokens"] or None, "stream": bool(v["stream"]),
            "add_generation_prompt": v["add_generation_prompt"],
            "continue_final_message": v["continue_final_message"],
            "add_special_tokens": v["add_special_tokens"]}  # fmt: skip


def _completion(body: dict[str, Any], _: str) -> Checked:
    r = completion_request(body)
    return {"model": r.model, "prompt": r.prompts, "max_tokens": r.requested_output[1],  # vLLM's 16 when absent
            "min_tokens": r.min_tokens or None, "n": r.n, "stream": r.stream,
            "add_special_tokens": r.add_special_tokens}  # fmt: skip


def _vllm_completion(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "prompt": prompts(v["prompt"]), "max_tokens": v["max_tokens"],
            "min_tokens": v["min_tokens"] or None, "n": v["n"] or 1, "stream": bool(v["stream"]),
            "add_special_tokens": v["add_special_tokens"]}  # fmt: skip


def _responses(body: dict[str, Any], _: str) -> Checked:
    r = responses_request(body)
    return {"model": r.model, "input": r.input if isinstance(r.input, str) else len(r.input),
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "stream": r.stream,
            "previous_response_id": r.previous_response_id}  # fmt: skip


def _vllm_responses(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "input": v["input"] if isinstance(v["input"], str) else len(v["input"]),
            "instructions": v["instructions"], "max_output_tokens": v["max_output_tokens"],
            "stream": bool(v["stream"]), "previous_response_id": v["previous_response_id"]}  # fmt: skip


def _messages(body: dict[str, Any], _: str) -> Checked:
    r = messages_request(body)
    return {"model": r.model, "messages": turns(r.messages), "system": r.system, "max_tokens": r.max_tokens,
            "stream": r.stream}  # fmt: skip


def _vllm_messages(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "messages": turns(v["messages"]), "system": v["system"],
            "max_tokens": v["max_tokens"], "stream": bool(v["stream"])}  # fmt: skip


def _embeddings(body: dict[str, Any], _: str) -> Checked:
    r = pooling_request(body, "embeddings")
    assert isinstance(r, PoolingRequest)
    return {"model": r.model, "input": r.prompts, "truncate_prompt_tokens": r.truncate_prompt_tokens,
            "add_special_tokens": r.add_special_tokens}  # fmt: skip


def _vllm_embeddings(v: dict[str, Any]) -> Checked:
    return {
        "model": model_of(v["model"]),
        "input": prompts(v["input"]),
        "truncate_prompt_tokens": v["truncate_prompt_tokens"],
        "add_special_tokens": v["add_special_tokens"],
    }


def _audio(raw: bytes, content_type: str, path: str) -> tuple[Checked, list[tuple[bytes, str]]]:
    r = audio_request(raw, content_type, path)
    checked = {"model": r.model, "max_completion_tokens": r.max_completion_tokens, "beams": r.beams,
               "stream": r.stream}  # fmt: skip
    return checked, [r.form.canonical(raw, {})]


def _vllm_audio(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "max_completion_tokens": v["max_completion_tokens"],
            "beams": v["n"] if v["use_beam_search"] else 1, "stream": bool(v["stream"])}  # fmt: skip


CHECKED: dict[str, tuple[Callable[[dict[str, Any], str], Checked], Callable[[dict[str, Any]], Checked]]] = {
    CHAT: (_chat, _vllm_chat),
    COMPLETIONS: (_completion, _vllm_completion),
    RESPONSES: (_responses, _vllm_responses),
    MESSAGES: (_messages, _vllm_messages),
    EMBEDDINGS: (_embeddings, _vllm_embeddings),
}
FORMS: dict[str, Callable[[dict[str, Any]], Checked]] = {TRANSCRIPTIONS: _vllm_audio, TRANSLATIONS: _vllm_audio}


def guard_reads(body: Body) -> GuardRead:
    """What the guard checks of `body` and the bodies it may forward, or its refusal."""
    try:
        if body.path in FORMS:
            checked, forwarded = _audio(body.raw, dict(body.sent())["content-type"], body.path)
            return GuardRead(checked, None, forwarded)
        parsed = parse_json_object(body.raw)
        checked = CHECKED[body.path][0](parsed, body.path)
    except InvalidRequest as exc:
        return GuardRead(None, exc.message)
    # passed as sent, or rewritten (a clamp, a truncation) from what the guard parsed
    return GuardRead(checked, None, [(body.raw, body.content_type), (with_changes(parsed, {}), JSON)])


def vllm_checked(path: str, request: dict[str, Any]) -> Checked:
    return FORMS[path](request) if path in FORMS else CHECKED[path][1](request)


def vllm_reads(version: str, requests: list[tuple[str, list[tuple[str, str]], bytes]]) -> list[VllmRead]:
    """Each (path, headers, body) read by vLLM `version`'s own routers and request models, in one process."""
    python = vllm_venv(version) / "bin" / "python"
    lines = "".join(json.dumps({"path": path, "headers": headers, "body": base64.b64encode(raw).decode()}) + "\n"
                    for path, headers, raw in requests)  # fmt: skip
    done = subprocess.run([str(python), str(READER)], input=lines, capture_output=True, text=True, timeout=600,
                          env=quiet_env(), check=True)  # fmt: skip
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(requests), done.stderr[-2000:]
    return [VllmRead(a["status"], a["request"]) for a in answers]


def vllm_fields(version: str) -> dict[str, list[str]]:
    """The field names (aliases) of vLLM `version`'s audio request models."""
    python = vllm_venv(version) / "bin" / "python"
    done = subprocess.run([str(python), str(READER), "--fields"], capture_output=True, text=True, timeout=600,
                          env=quiet_env(), check=True)  # fmt: skip
    found: dict[str, list[str]] = json.loads(done.stdout)
    return found
