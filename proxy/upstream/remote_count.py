"""Counting a prompt by asking the upstream (counting.source "upstream", and "auto" where the guard cannot count):
vLLM renders the request with its own renderer and processor and says how many tokens it makes.

Two ways, tried in this order: the render endpoints (`POST /v1/chat/completions/render`, `/v1/completions/render`;
vLLM 0.31+ with `--enable-scale-out`), which run the very path a generation runs and return its token ids; else
`POST /tokenize`, which renders chat with the Jinja template. /tokenize is exact for Hugging Face models, but not for
gpt-oss (vLLM renders its chat with harmony, /tokenize with the template) nor for tool conversations in mistral mode
(vLLM 0.31/0.32 refuse them there), so for those the check keeps counting local.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.upstream.client import Upstream
from proxy.upstream.http import count_bytes

log = logging.getLogger("token_guard.upstream_count")

JSON_HEADERS = {"content-type": "application/json"}
# How a server without the render endpoints answers them: vLLM 0.31 has no route (404); 0.32 has the routes and
# answers 403 unless started with --enable-scale-out.
NOT_OFFERED = (403, 404, 405, 501)
# The chat fields that change what vLLM renders; generation fields stay behind (their validation is not ours).
RENDER_FIELDS = ("messages", "tools", "tool_choice", "add_generation_prompt", "continue_final_message",
                 "add_special_tokens", "chat_template", "chat_template_kwargs", "documents", "reasoning_effort",
                 "mm_processor_kwargs")  # fmt: skip
TOKENIZE_FIELDS = ("messages", "tools", "add_generation_prompt", "continue_final_message", "add_special_tokens",
                   "chat_template")  # fmt: skip


def chat_tokenize_body(model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The /tokenize request that renders what the chat endpoint would. /tokenize has no `documents` or
    `reasoning_effort` and does not move `reasoning_content` to `reasoning`, so the guard does those itself, as
    vLLM's chat path does."""
    fields = {key: body[key] for key in TOKENIZE_FIELDS if body.get(key) is not None}
    if isinstance(fields.get("messages"), list):
        fields["messages"] = [_reasoning_renamed(m) for m in fields["messages"]]
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    for key, value in (("documents", body.get("documents")), ("reasoning_effort", effort)):
        if value is not None:
            kwargs[key] = value
    if effort is not None and "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
        kwargs["enable_thinking"] = effort != "none"
    return {"model": model, **fields, **({"chat_template_kwargs": kwargs} if kwargs else {})}


def _reasoning_renamed(message: Any) -> Any:
    if not isinstance(message, dict) or message.get("reasoning_content") is None:
        return message
    renamed = {k: v for k, v in message.items() if k != "reasoning_content"}
    if renamed.get("reasoning") is None:
        renamed["reasoning"] = message["reasoning_content"]
    return renamed


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

    async def chat(self, model: str, body: dict[str, Any]) -> int:
        if self.renders is not False:
            render = {"model": model, **{k: body[k] for k in RENDER_FIELDS if k in body}}
            found = await self._ask("/v1/chat/completions/render", render)
            if found is not None:
                return len(_token_ids(found))
        found = await self._ask("/tokenize", chat_tokenize_body(model, body), render=False)
        return _count(found)

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        extra = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
        counts = []
        for one in prompts:
            if isinstance(one, list):
                counts.append(len(one))
                continue
            found = await self._ask("/tokenize", {"model": model, "prompt": one, **extra}, render=False)
            counts.append(_count(found))
        return counts

    async def _ask(self, path: str, payload: dict[str, Any], render: bool = True) -> Any:
        """The upstream's JSON answer; None when a render endpoint is not offered (remembered)."""
        sent = json.dumps(payload).encode()
        opened = await self.upstream.open("POST", path, JSON_HEADERS, sent)
        response = opened.response
        try:
            raw = await response.read(count_bytes(len(sent)))
        finally:
            response.close()
        if render and response.status in NOT_OFFERED:
            if self.renders is None:
                log.info("upstream %s offers no %s (vLLM's --enable-scale-out); counting through POST /tokenize",
                         self.upstream.url, path)  # fmt: skip
            self.renders = False
            return None
        if render and response.status == 200:
            self.renders = True
        if path == "/tokenize" and (response.status == 200 or response.status in NOT_OFFERED):
            self.tokenizes = response.status == 200
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if response.status == 400:  # vLLM refuses the request itself: the client gets vLLM's reason
            raise InvalidRequest(_message(answer, raw), param="messages")
        if response.status != 200 or answer is None:
            raise UpstreamUnavailable(f"The upstream could not count the prompt ({path}: HTTP {response.status}).")
        return answer


def _token_ids(answer: Any) -> list[Any]:
    ids = answer.get("token_ids") if isinstance(answer, dict) else None
    if not isinstance(ids, list):
        raise UpstreamUnavailable("The upstream's render answer has no token_ids.")
    return ids


def _count(answer: Any) -> int:
    count = answer.get("count") if isinstance(answer, dict) else None
    if not isinstance(count, int):
        raise UpstreamUnavailable("The upstream's POST /tokenize answer has no count.")
    return count


def _message(answer: Any, raw: bytes) -> str:
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else raw.decode(errors="replace")[:300]
