"""What differs between the vLLM releases the simulator can pretend to be (docs/vllm-wire-contract.md, section 14).

0.31 and 0.32 share every response shape; they differ in how the context window is enforced and in the text
of the unknown-model error. Each difference is one field here, so the rules read `profile.reserves_output`
instead of comparing version strings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Profile:
    name: str
    version: str
    # 0.31 reserves the requested output inside the window (input limit = M - T) and rejects overflows;
    # 0.32 lets the prompt use the whole window and clamps max_tokens to M - N instead.
    reserves_output: bool
    # 0.32 appends " Valid aliases: a, b." to the unknown-model message.
    lists_aliases_on_not_found: bool
    # 0.32's /inference/v1/generate answers carry output_mode, and each choice stop_reason and weight_versions.
    generate_output_mode: bool
    # 0.32 checks the chat renderer's kv_transfer_params.prompt_token_ids, and renders the messages under echo;
    # 0.31 runs any value that is not empty.
    checks_transferred_ids: bool = True
    # 0.32 drops Claude Code's "x-anthropic-billing-header" line off a chat request's system text (chat_utils.py)
    strips_billing_header: bool = True
    # 0.34 takes Anthropic's `thinking: {"type": "between_tools"}` and renders it as disabled; earlier ones refuse it
    thinks_between_tools: bool = False
    # 0.33 ends a Responses stream whose response is incomplete (cut at max_output_tokens) with response.incomplete
    ends_incomplete_streams: bool = False
    # 0.34's Anthropic count_tokens counts a prompt longer than the window instead of answering 400
    counts_past_window: bool = False
    # 0.33 names the Messages API's errors in Anthropic's own types (invalid_request_error, overloaded_error, ...),
    # 0.31/0.32 by vLLM's exception names (BadRequestError, ...)
    anthropic_error_types: bool = False
    # 0.33's POST /pause (modes abort and wait) makes the engine refuse new requests with a retryable 503 until
    # POST /resume; 0.31/0.32's pause queues them instead, which the simulator does not imitate (no /pause there)
    refuses_while_paused: bool = False
    # 0.33 serves POST /v1/decisions: one engine request per question, a prompt and one token each
    serves_decisions: bool = False
    # 0.33 builds chat's and Responses' TokenizeParams with max_output_tokens None when the request sets no output
    # limit, so truncate_prompt_tokens -1 cuts the prompt to max_model_len - 1 and the answer gets 1 token;
    # 0.32 passes 0 there, cuts to max_model_len and refuses the 0 tokens left (max_tokens must be at least 1)
    cuts_short_unlimited: bool = False


V031 = Profile(
    name="0.31",
    version="0.31.0",
    reserves_output=True,
    lists_aliases_on_not_found=False,
    generate_output_mode=False,
    checks_transferred_ids=False,
    strips_billing_header=False,
)
V032 = Profile(name="0.32", version="0.32.0", reserves_output=False, lists_aliases_on_not_found=True,
               generate_output_mode=True)  # fmt: skip
# each later release: the one before it, and what it changed (docs/vllm-wire-contract.md)
V033 = replace(V032, name="0.33", version="0.33.0", ends_incomplete_streams=True, anthropic_error_types=True,
               refuses_while_paused=True, serves_decisions=True, cuts_short_unlimited=True)  # fmt: skip
V034 = replace(V033, name="0.34", version="0.34.0", thinks_between_tools=True, counts_past_window=True)
PROFILES: dict[str, Profile] = {profile.name: profile for profile in (V031, V032, V033, V034)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        supported = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown vLLM profile {name!r}; supported profiles: {supported}") from None
