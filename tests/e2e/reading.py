"""The differential reading of request bodies: the guard's readers against vLLM's own (tests/e2e/test_reading.py).

A `Body` is a request as a client sends it. The guard reads it with its wire model (api/): what it checks, or a
refusal; what it forwards is the body as sent or rewritten (JSON), or the form written anew (api/form.py). vLLM reads
what the guard forwards, and the client's own bytes, with its own routers, FastAPI and request models
(tests/e2e/vllm_reader.py, run in the e2e suite's vLLM environment, no server), and what vLLM's serving code then runs
of it before its engine (vllm_stages.py: the prompts a completion runs, a tensor of `prompt_embeds` as its rows, the
ids a chat runs in place of its messages). `CHECKED` says, for each route, what the guard checks and where vLLM holds
the same: to read another route or another field, add its pair there; to try another body, add a `Body` to
test_reading.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.api.anthropic import messages_request
from proxy.api.audio import audio_request
from proxy.api.body import parse_json_object, with_changes
from proxy.api.chat import chat_request, transferred_prompt
from proxy.api.completions import completion_request
from proxy.api.honoured import for_upstream
from proxy.api.invocations import invocation_kind, invoked_body
from proxy.api.pooling import PoolingRequest, ScoringRequest, pooling_request
from proxy.api.responses import responses_request
from proxy.errors import InvalidRequest
from tests.e2e.runtime import quiet_env, vllm_venv
from tests.e2e.tensors import Tensor, saved

READER = Path(__file__).with_name("vllm_reader.py")
JSON = "application/json"
CHAT, COMPLETIONS, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"
EMBEDDINGS, TRANSCRIPTIONS, TRANSLATIONS = "/v1/embeddings", "/v1/audio/transcriptions", "/v1/audio/translations"
INVOCATIONS, RERANK, SCORE = "/invocations", "/rerank", "/score"

Checked = dict[str, Any]


@dataclass(frozen=True)
class Body:
    name: str
    path: str
    raw: bytes  # `Tensor.MARK` with an index where that one of `tensors` goes, as base64 text
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()  # more headers, as sent (a second content-type, ...)
    served: str = "generate"  # the model vLLM serves: "generate", or "embed" (/invocations dispatches by it)
    tensors: tuple[Tensor, ...] = ()

    def sent(self) -> list[tuple[str, str]]:
        return [("content-type", self.content_type), *self.headers]


def with_tensors(bodies: list[Body]) -> list[Body]:
    """`bodies` with each tensor's base64 text where its mark is (torch.save runs once, for all of them)."""
    texts = iter(saved([t for b in bodies for t in b.tensors]))
    made = []
    for body in bodies:
        raw = body.raw
        for i, text in zip(range(len(body.tensors)), texts, strict=False):
            raw = raw.replace(Tensor.MARK.format(i).encode(), text.encode())
        made.append(replace(body, raw=raw, tensors=()))
    return made


@dataclass(frozen=True)
class GuardRead:
    checked: Checked | None  # None: refused
    refusal: str | None = None
    forwarded: list[Body] = field(default_factory=list)  # each request the guard may send upstream


@dataclass(frozen=True)
class VllmRead:
    status: int
    request: dict[str, Any] | None  # the request model's fields as vLLM holds them; None: refused
    runs: dict[str, Any] = field(default_factory=dict)  # what its serving code runs of it (vllm_stages.py)

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


class Besides(int):
    """The ids of `kv_transfer_params` the guard counts besides the messages, the larger of the two deciding: vLLM
    runs what the guard counted if it runs these ids, or the messages instead (None: 0.32 under `echo` or with media
    parts, whose request model drops the ids)."""

    def __eq__(self, other: object) -> bool:
        return other is None or int(self) == other

    __hash__ = int.__hash__


def _transferred(body: dict[str, Any]) -> Besides | None:
    ids = transferred_prompt(body)
    return None if ids is None else Besides(ids)


def _chat(body: dict[str, Any], _: Mapping[str, str]) -> Checked:
    r = chat_request(body)
    return {"model": r.model, "messages": turns(r.messages), "max_tokens": r.max_tokens, "n": r.n,
            "max_completion_tokens": r.max_completion_tokens, "min_tokens": r.min_tokens or None, "stream": r.stream,
            "add_generation_prompt": r.add_generation_prompt, "continue_final_message": r.continue_final_message,
            "add_special_tokens": r.add_special_tokens, "prompt_token_ids": _transferred(body)}  # fmt: skip


def _vllm_chat(v: dict[str, Any], runs: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "messages": turns(v["messages"]), "max_tokens": v["max_tokens"],
            "n": v["n"] or 1, "max_completion_tokens": v["max_completion_tokens"],
            "min_tokens": v["min_tokens"] or None, "stream": bool(v["stream"]),
            "add_generation_prompt": v["add_generation_prompt"],
            "continue_final_message": v["continue_final_message"],
            "add_special_tokens": v["add_special_tokens"], "prompt_token_ids": _ran(runs)}  # fmt: skip


def _ran(runs: dict[str, Any]) -> Any:
    """How many ids of `kv_transfer_params` vLLM runs in place of the messages (None: it renders the messages)."""
    ran = runs.get("prompt_token_ids")
    return len(ran) if isinstance(ran, list) else ran


def _completion(body: dict[str, Any], _: Mapping[str, str]) -> Checked:
    r = completion_request(body)
    return {"model": r.model, "prompts": [*({"embeds": rows} for rows in r.embeds), *r.prompts],
            "max_tokens": r.requested_output[1],  # vLLM's 16 when absent
            "min_tokens": r.min_tokens or None, "n": r.n, "stream": r.stream,
            "add_special_tokens": r.add_special_tokens}  # fmt: skip


def _vllm_completion(v: dict[str, Any], runs: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "prompts": runs["prompts"], "max_tokens": v["max_tokens"],
            "min_tokens": v["min_tokens"] or None, "n": v["n"] or 1, "stream": bool(v["stream"]),
            "add_special_tokens": v["add_special_tokens"]}  # fmt: skip


def _responses(body: dict[str, Any], _: Mapping[str, str]) -> Checked:
    r = responses_request(body)
    return {"model": r.model, "input": r.input if isinstance(r.input, str) else len(r.input),
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "stream": r.stream,
            "previous_response_id": r.previous_response_id}  # fmt: skip


def _vllm_responses(v: dict[str, Any], _: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "input": v["input"] if isinstance(v["input"], str) else len(v["input"]),
            "instructions": v["instructions"], "max_output_tokens": v["max_output_tokens"],
            "stream": bool(v["stream"]), "previous_response_id": v["previous_response_id"]}  # fmt: skip


def _messages(body: dict[str, Any], _: Mapping[str, str]) -> Checked:
    r = messages_request(body)
    return {"model": r.model, "messages": turns(r.messages), "system": r.system, "max_tokens": r.max_tokens,
            "stream": r.stream}  # fmt: skip


def _vllm_messages(v: dict[str, Any], _: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "messages": turns(v["messages"]), "system": v["system"],
            "max_tokens": v["max_tokens"], "stream": bool(v["stream"])}  # fmt: skip


def _embeddings(body: dict[str, Any], _: Mapping[str, str]) -> Checked:
    r = pooling_request(body, "embeddings")
    assert isinstance(r, PoolingRequest)
    return {"model": r.model, "input": r.prompts, "truncate_prompt_tokens": r.truncate_prompt_tokens,
            "add_special_tokens": r.add_special_tokens}  # fmt: skip


def _vllm_embeddings(v: dict[str, Any], _: dict[str, Any]) -> Checked:
    return {
        "model": model_of(v["model"]),
        "input": prompts(v["input"]),
        "truncate_prompt_tokens": v["truncate_prompt_tokens"],
        "add_special_tokens": v["add_special_tokens"],
    }


def _audio(raw: bytes, content_type: str, path: str) -> tuple[Checked, tuple[bytes, str]]:
    r = audio_request(raw, content_type, path)
    checked = {"model": r.model, "max_completion_tokens": r.max_completion_tokens, "beams": r.beams,
               "stream": r.stream}  # fmt: skip
    return checked, r.form.canonical(raw, {})  # the form written anew, and its content type


def _vllm_audio(v: dict[str, Any]) -> Checked:
    return {"model": model_of(v["model"]), "max_completion_tokens": v["max_completion_tokens"],
            "beams": v["n"] if v["use_beam_search"] else 1, "stream": bool(v["stream"])}  # fmt: skip


def _invocation(body: dict[str, Any], headers: Mapping[str, str]) -> Checked:
    """/invocations: the endpoint vLLM's SageMaker route dispatches to, the model, and the prompts counted (each
    endpoint's other fields are held to vLLM's on its own route, read by the same wire model)."""
    seen = invoked_body(body, headers)
    kind = invocation_kind(seen)
    if kind == "chat":
        r = chat_request(seen)
        return {"endpoint": kind, "model": r.model, "prompts": [turns(r.messages)],
                "prompt_token_ids": _transferred(seen)}  # fmt: skip
    if kind == "completion":
        return {"endpoint": kind, **{k: v for k, v in _completion(seen, headers).items() if k in ("model", "prompts")}}
    pooled = pooling_request(seen, kind)
    if isinstance(pooled, ScoringRequest):
        return {"endpoint": kind, "model": pooled.model, "prompts": [pooled.queries, pooled.documents]}
    counted = pooled.prompts or [turns(c) for c in pooled.conversations]
    return {"endpoint": kind, "model": pooled.model, "prompts": counted}


SCORED = {"RerankRequest": ("query", "documents"), "ScoreDataRequest": ("data_1", "data_2"),
          "ScoreQueriesDocumentsRequest": ("queries", "documents"), "ScoreQueriesItemsRequest": ("queries", "items"),
          "ScoreTextRequest": ("text_1", "text_2")}  # fmt: skip


def _vllm_invocation(v: dict[str, Any], runs: dict[str, Any]) -> Checked:
    """vLLM's request model named by its class. An embedding model embeds a `messages` body as its chat form, which
    the guard counts as chat: the same messages, and the generation prompt besides (a few tokens more, never fewer)."""
    endpoint, model = runs["endpoint"], model_of(v["model"])
    if endpoint in ("ChatCompletionRequest", "EmbeddingChatRequest"):
        return {"endpoint": "chat", "model": model, "prompts": [turns(v["messages"])], "prompt_token_ids": _ran(runs)}
    if endpoint == "CompletionRequest":
        return {"endpoint": "completion", "model": model, "prompts": runs["prompts"]}
    if endpoint == "EmbeddingCompletionRequest":
        return {"endpoint": "embeddings", "model": model, "prompts": prompts(v["input"])}
    if endpoint in ("EmbeddingChatInputRequest", "EmbeddingBatchChatInputRequest"):  # conversations in `input`
        batch = v["messages"] if endpoint.startswith("EmbeddingBatch") else [v["messages"]]
        return {"endpoint": "embeddings", "model": model, "prompts": [turns(c) for c in batch]}
    if endpoint in SCORED:
        texts = [[t for t in (side if isinstance(side, list) else [side]) if isinstance(t, str)]
                 for side in (v[SCORED[endpoint][0]], v[SCORED[endpoint][1]])]  # fmt: skip
        return {"endpoint": "rerank" if endpoint == "RerankRequest" else "score", "model": model, "prompts": texts}
    return {"endpoint": endpoint}  # one the guard never names


CHECKED: dict[str, tuple[Callable[[dict[str, Any], Mapping[str, str]], Checked],
                         Callable[[dict[str, Any], dict[str, Any]], Checked]]] = {
    CHAT: (_chat, _vllm_chat),
    COMPLETIONS: (_completion, _vllm_completion),
    RESPONSES: (_responses, _vllm_responses),
    MESSAGES: (_messages, _vllm_messages),
    EMBEDDINGS: (_embeddings, _vllm_embeddings),
    INVOCATIONS: (_invocation, _vllm_invocation),
}  # fmt: skip
FORMS: dict[str, Callable[[dict[str, Any]], Checked]] = {TRANSCRIPTIONS: _vllm_audio, TRANSLATIONS: _vllm_audio}


def guard_reads(body: Body) -> GuardRead:
    """What the guard checks of `body` and the requests it may forward, or its refusal."""
    assert not body.tensors, "a body's tensors are written first (with_tensors)"
    headers = {name.lower(): value for name, value in body.sent()}  # as serve reads them: one each, the last
    try:
        if body.path in FORMS:
            checked, form = _audio(body.raw, headers["content-type"], body.path)
            return GuardRead(checked, None, [replace(body, raw=form[0], content_type=form[1], headers=())])
        parsed = parse_json_object(body.raw)
        checked = CHECKED[body.path][0](parsed, headers)
    except InvalidRequest as exc:
        return GuardRead(None, exc.message)
    upstream = for_upstream("invocations" if body.path == INVOCATIONS else None, headers)
    if body.path == INVOCATIONS:  # what goes upstream names the model the guard checked (policy/guard.py)
        parsed = invoked_body(parsed, headers)
    more = tuple((k, v) for k, v in upstream.items() if k != "content-type")
    rewritten = with_changes(parsed, {})
    # passed as sent (on /invocations, as the guard wrote it), or rewritten (a clamp, a cut) from what it parsed
    as_sent = replace(body, raw=rewritten if body.path == INVOCATIONS else body.raw, headers=more,
                      content_type=upstream.get("content-type", JSON))  # fmt: skip
    return GuardRead(checked, None, [as_sent, replace(body, raw=rewritten, content_type=JSON, headers=more)])


def vllm_checked(path: str, read: VllmRead) -> Checked:
    assert read.request is not None
    return FORMS[path](read.request) if path in FORMS else CHECKED[path][1](read.request, read.runs)


def vllm_reads(version: str, requests: list[Body]) -> list[VllmRead]:
    """Each request read by vLLM `version`'s own routers and request models, in one process."""
    python = vllm_venv(version) / "bin" / "python"
    lines = "".join(json.dumps({"path": r.path, "headers": r.sent(), "body": base64.b64encode(r.raw).decode(),
                                "served": r.served}) + "\n" for r in requests)  # fmt: skip
    done = subprocess.run([str(python), str(READER)], input=lines, capture_output=True, text=True, timeout=600,
                          env=quiet_env(), check=True)  # fmt: skip
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(requests), done.stderr[-2000:]
    return [VllmRead(a["status"], a["request"], a.get("runs") or {}) for a in answers]


def vllm_fields(version: str) -> dict[str, list[str]]:
    """The field names (aliases) of vLLM `version`'s audio request models."""
    python = vllm_venv(version) / "bin" / "python"
    done = subprocess.run([str(python), str(READER), "--fields"], capture_output=True, text=True, timeout=600,
                          env=quiet_env(), check=True)  # fmt: skip
    found: dict[str, list[str]] = json.loads(done.stdout)
    return found
