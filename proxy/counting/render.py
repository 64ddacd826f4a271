"""Render a chat request into the prompt text vLLM tokenizes: messages -> vLLM's conversation -> the chat template.
The template engine's errors become the guard's 400 here, at one boundary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from proxy.api.chat import ChatRequest
from proxy.counting.conversation import ConversationError, MediaPart, template_inputs, to_conversation, to_tools
from proxy.counting.processor import UNHASHABLE
from proxy.counting.roles import developer_as_system, has_developer, mentions_developer
from proxy.counting.templates import RenderArgs, TemplateError, render
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import CountedUpstreamOnly, InvalidRequest, TemplateRefused

NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template "
    "if the tokenizer does not define one."
)

NO_SANDBOX = "This server does not render a chat template passed with the request."

BOTH_FLAGS = (
    "continue_final_message and add_generation_prompt are not compatible (add_generation_prompt defaults to true: "
    "send false with continue_final_message)."
)


def render_chat(tok: ModelTokenizer, req: ChatRequest) -> str:
    with _as_bad_request(own_template=req.chat_template is None):
        return render(*render_inputs(tok, req))


async def render_chat_isolated(tok: ModelTokenizer, req: ChatRequest) -> str:
    """As render_chat, for a template the request brought: in a child process with a time and memory limit (the
    tokenizer's sandbox)."""
    if tok.sandbox is None:
        raise InvalidRequest(NO_SANDBOX, param="chat_template")
    with _as_bad_request(own_template=False):
        return await tok.sandbox.render(render_inputs(tok, req))


def render_inputs(tok: ModelTokenizer, req: ChatRequest) -> RenderArgs:
    """What templates.render takes for this request: the template, whether it is trusted, vLLM's conversation..."""
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidRequest(BOTH_FLAGS, param="continue_final_message")
    template = tok.template_for(req.tools, req.chat_template)
    if template is None and tok.processor_refuses(req.tools):
        raise InvalidRequest(UNHASHABLE)  # vLLM's TypeError, answered as its 400 (no param)
    if template is None:
        raise InvalidRequest(NO_TEMPLATE, param="messages")
    conversation = to_conversation(req.messages, tok.content_format(template), tok.strip_billing_header)
    if has_developer(conversation) and not mentions_developer(template):
        conversation = developer_as_system(conversation)
    variables = {**tok.special_tokens, **template_inputs(req.body, req.chat_template_kwargs, tok.default_kwargs)}
    trusted = req.chat_template is None  # the model's own template; a request's runs in the sandbox
    return (template, trusted, conversation, to_tools(req.tools), req.add_generation_prompt,
            req.continue_final_message, variables)  # fmt: skip


@contextmanager
def _as_bad_request(own_template: bool) -> Iterator[None]:
    try:
        yield
    except MediaPart as exc:
        raise CountedUpstreamOnly(f"{exc}: only the upstream can count it", param="messages") from None
    except ConversationError as exc:
        raise InvalidRequest(str(exc), param="messages") from None
    except TemplateError as exc:
        refused = TemplateRefused if own_template else InvalidRequest  # a request's template: vLLM's would refuse too
        raise refused(f"The chat template could not render these messages: {exc}", param="messages") from None
