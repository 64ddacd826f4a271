"""Render a chat request into the prompt text vLLM tokenizes: messages -> vLLM's conversation -> the chat template.
The template engine's errors become the guard's 400 here, at one boundary."""

from __future__ import annotations

from proxy.api.chat import ChatRequest
from proxy.counting.conversation import ConversationError, template_inputs, to_conversation, to_tools
from proxy.counting.templates import TemplateError, render
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import InvalidRequest

NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template "
    "if the tokenizer does not define one."
)


def render_chat(tok: ModelTokenizer, req: ChatRequest) -> str:
    template = tok.template_for(req.tools, req.chat_template)
    if template is None:
        raise InvalidRequest(NO_TEMPLATE, param="messages")
    try:
        conversation = to_conversation(req.messages, tok.content_format(template))
        variables = {**tok.special_tokens, **template_inputs(req.body, req.chat_template_kwargs)}
        trusted = req.chat_template is None  # the model's own template; a request's runs in the sandbox
        return render(template, trusted, conversation, to_tools(req.tools), req.add_generation_prompt,
                      req.continue_final_message, variables)  # fmt: skip
    except ConversationError as exc:
        raise InvalidRequest(str(exc), param="messages") from None
    except TemplateError as exc:
        raise InvalidRequest(f"The chat template could not render these messages: {exc}", param="messages") from None
