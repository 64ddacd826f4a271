"""Count prompt tokens exactly as vLLM does (wire contract, section 12), without blocking the event loop.

Chat: messages -> vLLM's conversation -> the chat template -> encode with add_special_tokens false by default.
Completions: each string prompt encoded with special tokens (default true); token-id prompts counted as given.
The model's `TokenCounter` does the encoding: segment-cached, and off the event loop (see proxy/counter.py).
"""

from __future__ import annotations

from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.conversation import ConversationError, template_inputs, to_conversation, to_tools
from proxy.counting.counter import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import InvalidRequest
from proxy.settings import CountingSettings

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


async def count_chat(tok: ModelTokenizer, req: ChatRequest, counter: TokenCounter | None = None) -> int:
    text = render_chat(tok, req)
    (count,) = await _counter(tok, counter).count([text], req.add_special_tokens)
    return count


async def count_completion(
    tok: ModelTokenizer, req: CompletionRequest, counter: TokenCounter | None = None
) -> list[int]:
    texts = [p for p in req.prompts if isinstance(p, str)]
    text_counts = iter(await _counter(tok, counter).count(texts, req.add_special_tokens) if texts else [])
    return [next(text_counts) if isinstance(p, str) else len(p) for p in req.prompts]


def _counter(tok: ModelTokenizer, counter: TokenCounter | None) -> TokenCounter:
    """The model's counter; one-off callers without one get a throwaway counter with no cache."""
    return counter if counter is not None else TokenCounter(tok.backend, CountingSettings(cache_mb=0), name=tok.source)
