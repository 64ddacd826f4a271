"""What differs between the vLLM releases the simulator can pretend to be (docs/vllm-wire-contract.md, section 14).

0.31 and 0.32 share every response shape; they differ in how the context window is enforced and in the text
of the unknown-model error. Each difference is one field here, so the rules read `profile.reserves_output`
instead of comparing version strings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.cache_info import LABELS_031, LABELS_032, LABELS_033, LABELS_034, Labels

# the render routes' answer, vLLM's GenerateRequest (scale_out/token_in_token_out/protocol.py), keys in order
RENDER_KEYS_031 = ("request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params", "model",
                   "return_token_ids", "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params",
                   "ec_transfer_params")  # fmt: skip
RENDER_KEYS_032 = (*RENDER_KEYS_031[:7], "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids",
                   "output_mode", *RENDER_KEYS_031[8:])  # fmt: skip
RENDER_KEYS_033 = (*RENDER_KEYS_032[:11], "parse_context", *RENDER_KEYS_032[11:])


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
    # 0.34's Anthropic Messages take min_tokens (to SamplingParams, which refuses one above max_tokens); earlier ones
    # ignore the field
    takes_min_tokens: bool = False
    # 0.34 reads a chat request's `tools: []` as no tools ("auto"/"required" tool_choice as "none"); earlier ones
    # refuse it
    empty_tools_as_none: bool = False
    # 0.34's Responses take thinking_token_budget (a count, or -1: unlimited; refused without a reasoning parser);
    # earlier ones ignore the field
    budgets_responses_thinking: bool = False
    # 0.34 fills in what an OpenResponses assistant or reasoning input item leaves out and converts the items 0.33
    # fails on or passes as they are: an output message without content (""), reasoning and assistant dicts
    fills_response_items: bool = False
    # 0.34 renders a gpt-oss Responses reasoning item without content as an empty assistant message (0.31-0.33 skip
    # it) and reads an item without a type as a message only with a role, as reasoning with a summary
    keeps_empty_reasoning: bool = False
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
    # 0.33's content-format detection follows `namespace(rest=messages)` and `ns.rest = messages` aliases
    follows_namespace_aliases: bool = False
    # 0.34 gives an Anthropic tool result's tool references and text one tool message; earlier ones two
    joins_tool_references: bool = False
    # 0.33's Responses bodies (and the `response` inside stream events) echo prompt_cache_key, prompt_cache_options,
    # prompt_cache_retention and safety_identifier (responses/protocol.py ResponsesResponse.from_request)
    echoes_prompt_cache: bool = False
    # 0.33 writes /pooling, /v1/embeddings and the render routes with orjson (api_utils.create_json_response):
    # 1e-05 prints 0.00001, 1e-06 prints 1e-6; /classify, /score and /rerank stay on starlette's JSONResponse
    pools_with_orjson: bool = False
    # 0.34 leaves usage.prompt_tokens_details and a chat message's annotations out when null (pydantic exclude_if)
    omits_null_details: bool = False
    # /metrics' vllm:cache_config_info labels, in order (cache_info.py): 0.33 adds simple_cpu_offload_num_blocks,
    # 0.34 enable_extensible_kv_cache and _extensible_kv_cache_resolved, and its gpu_memory_utilization reads "None"
    cache_info_labels: Labels = LABELS_032
    # 0.33 builds chat's and Responses' TokenizeParams with max_output_tokens None when the request sets no output
    # limit, so truncate_prompt_tokens -1 cuts the prompt to max_model_len - 1 and the answer gets 1 token;
    # 0.32 passes 0 there, cuts to max_model_len and refuses the 0 tokens left (max_tokens must be at least 1)
    cuts_short_unlimited: bool = False
    # 0.33's chat and completions stream events end with "kv_transfer_params":null (set on every token event, after
    # the fingerprint of a finish event), and give a finish event's choice (completions: every choice) weight_versions
    streams_transfer_params: bool = False
    # 0.34 reads an AutoProcessor chat template stored as a dict by its "default" entry (none: the tokenizer's
    # template serves); 0.31-0.33 hand the dict on whole and answer every request without tools 400
    reads_processor_default: bool = False
    # 0.34's Messages API start-up probe of the chat template (_detect_merge_inline_system) reads any error as "merge
    # inline system messages"; 0.31-0.33 catch only jinja2.TemplateError, so any other error stops their start-up
    probe_catches_any: bool = False
    # 0.32+ answers the scale-out routes of a server started without --enable-scale-out with a 403
    # PermissionDeniedError; 0.31 does not register them (FastAPI's 404)
    forbids_scale_out_off: bool = True
    # the keys of a render answer (render.py)
    render_keys: tuple[str, ...] = RENDER_KEYS_032
    # 0.32's render routes take the X-Request-Id header (then the body's request_id) for the request id, and refuse
    # beam search on completions as on chat; 0.31's ids are random and its completions render takes beam search
    render_reads_request_ids: bool = True
    # 0.33's render answers carry kv/ec transfer params at the top level (out of sampling_params.extra_args), echo
    # return_token_ids and give chat a parse_context
    render_hoists_transfer: bool = False


V031 = Profile(
    name="0.31",
    version="0.31.0",
    reserves_output=True,
    lists_aliases_on_not_found=False,
    generate_output_mode=False,
    checks_transferred_ids=False,
    strips_billing_header=False,
    cache_info_labels=LABELS_031,
    forbids_scale_out_off=False,
    render_keys=RENDER_KEYS_031,
    render_reads_request_ids=False,
)
V032 = Profile(name="0.32", version="0.32.0", reserves_output=False, lists_aliases_on_not_found=True,
               generate_output_mode=True)  # fmt: skip
# each later release: the one before it, and what it changed (docs/vllm-wire-contract.md)
V033 = replace(V032, name="0.33", version="0.33.0", ends_incomplete_streams=True, anthropic_error_types=True,
               refuses_while_paused=True, serves_decisions=True, follows_namespace_aliases=True,
               echoes_prompt_cache=True, pools_with_orjson=True, cache_info_labels=LABELS_033,
               cuts_short_unlimited=True, streams_transfer_params=True, render_keys=RENDER_KEYS_033,
               render_hoists_transfer=True)  # fmt: skip
V034 = replace(V033, name="0.34", version="0.34.0", thinks_between_tools=True, counts_past_window=True,
               joins_tool_references=True, takes_min_tokens=True, empty_tools_as_none=True,
               budgets_responses_thinking=True, omits_null_details=True, cache_info_labels=LABELS_034,
               fills_response_items=True, reads_processor_default=True, keeps_empty_reasoning=True,
               probe_catches_any=True)  # fmt: skip
PROFILES: dict[str, Profile] = {profile.name: profile for profile in (V031, V032, V033, V034)}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        supported = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown vLLM profile {name!r}; supported profiles: {supported}") from None
