"""Render a chat request into the prompt text vLLM tokenizes: messages -> vLLM's conversation -> the chat template.
The template engine's errors become the guard's 400 here, at one boundary."""

from __future__ import annotations

from proxy.api.chat import ChatRequest
from proxy.counting.conversation import ConversationError, template_inputs, to_conversation, to_tools
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
        rendered = tok.renderer.apply_chat_template(
            conversation,
            tools=to_tools(req.tools),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            **template_inputs(req.body, req.chat_template_kwargs),
        )
    except ConversationError as exc:
        raise InvalidRequest(str(exc), param="messages") from None
    except Exception as exc:  # jinja2 and transformers raise many kinds for templates that refuse a conversation
        raise InvalidRequest(f"The chat template could not render these messages: {exc}", param="messages") from None
    if not isinstance(rendered, str):
        raise InvalidRequest("The chat template did not render to text.", param="messages")
    return rendered
