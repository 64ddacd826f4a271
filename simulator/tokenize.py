"""POST /tokenize and /detokenize (docs/vllm-wire-contract.md, section 5): the same rendering as generation, with no
length limit and no truncation. The body's shape picks the form: `messages` means chat, otherwise `prompt`."""

from __future__ import annotations

from typing import Any

from simulator.chat_prompt import check_prompt_flags, check_template_trust, read_chat_options, render_chat
from simulator.context import Context
from simulator.wire import Fields


def tokenize(ctx: Context, body: Any) -> dict[str, Any]:
    is_chat = isinstance(body, dict) and "messages" in body
    if is_chat:
        check_prompt_flags(body)
    fields = Fields(body)
    model = fields.str_or_none("model")
    want_strs = bool(fields.bool_or_none("return_token_strs", False))
    if is_chat:
        options = read_chat_options(fields)
        fields.check()
        ctx.check_model(model)
        check_template_trust(options, ctx.settings.trust_request_chat_template)
        ids = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header).token_ids
    else:
        prompt = fields.require("prompt")
        if fields.has("prompt") and not isinstance(prompt, str):
            fields.invalid("body.prompt", "string_type", "Input should be a valid string", prompt)
        add_special_tokens = fields.boolean("add_special_tokens", True)
        fields.check()
        ctx.check_model(model)
        ids = ctx.tokenizer.encode(str(prompt), add_special_tokens)
    return {
        "count": len(ids),
        "max_model_len": ctx.settings.max_model_len,
        "tokens": ids,
        "token_strs": ctx.tokenizer.token_strs(ids) if want_strs else None,
    }


def detokenize(ctx: Context, body: Any) -> dict[str, Any]:
    fields = Fields(body)
    model = fields.str_or_none("model")
    tokens = fields.require("tokens")
    ids = fields.ints("tokens", tokens) if isinstance(tokens, list) else []
    if fields.has("tokens") and not isinstance(tokens, list):
        fields.invalid("body.tokens", "list_type", "Input should be a valid list", tokens)
    fields.check()
    ctx.check_model(model)
    return {"prompt": ctx.tokenizer.decode(ids)}
