"""Counting a prompt by asking the upstream (counting.source "upstream", and "auto" where the guard cannot count):
vLLM renders the request with its own renderer and processor and says how many tokens it makes.

Two ways, tried in this order: the render endpoints (`POST /v1/chat/completions/render`, `/v1/completions/render`;
vLLM 0.31+ with `--enable-scale-out`), which run the very path a generation runs and return its token ids; else
`POST /tokenize`, which renders chat with the Jinja template. /tokenize is exact for Hugging Face models, but not for
gpt-oss (vLLM renders its chat with harmony, /tokenize with the template) nor for tool conversations in mistral mode
(vLLM 0.31/0.32 refuse them there), so for those the check keeps counting local.

The one client of the upstream's counting endpoints: the request bodies, the POST (`post_json`) and the reading of its
answer (`Reply`); `token-guard doctor` asks /tokenize through them too (proxy/drift/sides.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.upstream.client import Upstream
from proxy.upstream.transport import count_bytes

log = logging.getLogger("token_guard.upstream_count")

JSON_HEADERS = {"content-type": "application/json"}
# How a server without the render endpoints answers them: vLLM 0.31 has no route (404); 0.32 has the routes and
# answers 403 unless started with --enable-scale-out.
NOT_OFFERED = (403, 404, 405, 501)
NO_ROUTE = b'{"detail":"Not Found"}'  # vLLM's (FastAPI's) 404 for a path it has no route for, not a model it lacks
# The chat fields that change what vLLM renders; generation fields stay behind (their validation is not ours).
# response_format: mistral_common renders it (0.34+; 0.33's /tokenize has no such field and ignores it).
RENDER_FIELDS = ("messages", "tools", "tool_choice", "add_generation_prompt", "continue_final_message",
                 "add_special_tokens", "chat_template", "chat_template_kwargs", "documents", "reasoning_effort",
                 "mm_processor_kwargs", "response_format")  # fmt: skip
TOKENIZE_FIELDS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "add_special_tokens",
                   "chat_template", "response_format")  # fmt: skip


def chat_tokenize_body(model: str, body: dict[str, Any], effort_map: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The /tokenize request that renders what the chat endpoint would. /tokenize has no `documents` or
    `reasoning_effort` and does not move `reasoning_content` to `reasoning`, so the guard does those itself, as
    vLLM's chat path does; and with them the server's --reasoning-effort-map (0.33+), which the chat path applies
    and /tokenize, taking no effort, never sees."""
    fields = {key: body[key] for key in TOKENIZE_FIELDS if body.get(key) is not None}
    if isinstance(fields.get("messages"), list):
        fields["messages"] = [_reasoning_renamed(m) for m in fields["messages"]]
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort_map and effort in effort_map:
        effort = effort_map[effort]
    for key, value in (("documents", body.get("documents")), ("reasoning_effort", effort)):
        if value is not None:
            kwargs[key] = value
    if effort is not None and "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
        kwargs["enable_thinking"] = effort != "none"
    return {"model": model, **fields, **({"chat_template_kwargs": kwargs} if kwargs else {})}


def completion_tokenize_body(model: str, prompt: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The /tokenize request for `prompt`, one of a completions request's (`body`) prompts."""
    extra = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
    return {"model": model, "prompt": prompt, **extra}


def _reasoning_renamed(message: Any) -> Any:
    if not isinstance(message, dict) or message.get("reasoning_content") is None:
        return message
    renamed = {k: v for k, v in message.items() if k != "reasoning_content"}
    if renamed.get("reasoning") is None:
        renamed["reasoning"] = message["reasoning_content"]
    return renamed


@dataclass(frozen=True)
class Reply:
    """The upstream's answer to a POST, read whole within its limit, and what it says: a count, or an error's
    message."""

    status: int
    raw: bytes
    payload: Any = None  # the JSON; None when it is not JSON

    @classmethod
    def of(cls, status: int, raw: bytes) -> Reply:
        try:
            return cls(status, raw, json.loads(raw))
        except ValueError:
            return cls(status, raw)

    @property
    def no_route(self) -> bool:
        return self.status == 404 and self.raw.strip() == NO_ROUTE

    def tokenized(self) -> int | None:
        """POST /tokenize's count; None when the answer is not a 200 with one."""
        count = self.payload.get("count") if self.status == 200 and isinstance(self.payload, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def rendered(self) -> int | None:
        """A render endpoint's token count (its token_ids); None when the answer is not a 200 with them."""
        ids = self.payload.get("token_ids") if self.status == 200 and isinstance(self.payload, dict) else None
        return len(ids) if isinstance(ids, list) else None

    def message(self) -> str:
        """What an error answer says: OpenAI's envelope, vLLM's older one or FastAPI's detail, else its first bytes."""
        if isinstance(self.payload, dict):
            error = self.payload.get("error")
            said = (error.get("message") if isinstance(error, dict) else error, self.payload.get("message"),
                    self.payload.get("detail"))  # fmt: skip
            for message in said:
                if isinstance(message, str):
                    return message
        return self.raw.decode(errors="replace")[:200]


async def post_json(upstream: Upstream, path: str, payload: dict[str, Any]) -> Reply:
    """POST `payload` to the upstream and read its answer, no further than a limit that grows with what was sent."""
    sent = json.dumps(payload).encode()
    response = (await upstream.open("POST", path, JSON_HEADERS, sent)).response
    try:
        return Reply.of(response.status, await response.read(count_bytes(len(sent))))
    finally:
        response.close()


class RemoteCounter:
    """Counts prompts through the upstream; remembers whether it offers the render endpoints and POST /tokenize."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.renders: bool | None = None  # None: not known yet
        self.tokenizes: bool | None = None  # POST /tokenize (servers other than vLLM may have neither)

    @property
    def method(self) -> str:
        return {True: "render endpoints", False: "POST /tokenize", None: "render endpoints, else POST /tokenize"}[
            self.renders
        ]

    async def chat(self, model: str, body: dict[str, Any], effort_map: Mapping[str, str] | None = None) -> int:
        """The chat prompt's count: the render endpoint maps the effort itself (it is the chat path's), /tokenize
        is given the mapped one."""
        if self.renders is not False:
            count = await self._render({"model": model, **{k: body[k] for k in RENDER_FIELDS if k in body}})
            if count is not None:
                return count
        return await self._tokenize(chat_tokenize_body(model, body, effort_map))

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        counts = []
        for one in prompts:
            if isinstance(one, list):
                counts.append(len(one))
                continue
            counts.append(await self._tokenize(completion_tokenize_body(model, one, body)))
        return counts

    async def _render(self, payload: dict[str, Any]) -> int | None:
        """The chat render endpoint's count; None when it is not offered (remembered)."""
        path = "/v1/chat/completions/render"
        reply = await post_json(self.upstream, path, payload)
        if reply.status in NOT_OFFERED:
            if self.renders is None:
                log.info("upstream %s offers no %s (vLLM's --enable-scale-out); counting through POST /tokenize",
                         self.upstream.where, path)  # fmt: skip
            self.renders = False
            return None
        if reply.status == 200:
            self.renders = True
        return _counted(_answered(reply, path).rendered(), "render answer has no token_ids")

    async def _tokenize(self, payload: dict[str, Any]) -> int:
        reply = await post_json(self.upstream, "/tokenize", payload)
        if reply.status == 200 or reply.status in NOT_OFFERED:
            self.tokenizes = reply.status == 200
        return _counted(_answered(reply, "/tokenize").tokenized(), "POST /tokenize answer has no count")


def _answered(reply: Reply, path: str) -> Reply:
    """`reply` when it is a 200 with JSON; vLLM refusing the request itself (400) is the client's error, with vLLM's
    reason, and anything else the upstream's failure."""
    if reply.status == 400:
        raise InvalidRequest(reply.message(), param="messages")
    if reply.status != 200 or reply.payload is None:
        raise UpstreamUnavailable(f"The upstream could not count the prompt ({path}: HTTP {reply.status}).")
    return reply


def _counted(count: int | None, missing: str) -> int:
    if count is None:
        raise UpstreamUnavailable(f"The upstream's {missing}.")
    return count
