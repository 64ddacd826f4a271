"""vLLM's context-window rules as pure functions over counts (docs/vllm-wire-contract.md, sections 2.4, 2.5 and 3).

Each check returns the exact error vLLM would send, or None. `resolve_max_tokens` runs them in vLLM's order
and returns the error or the number of tokens the engine will generate. Nothing here tokenizes: callers pass
the prompt's real token count and, for text prompts, its character count.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ApiError, validation_error
from simulator.profiles import Profile

MAX_N_SEQUENCES = 16384
_GREEDY_EPSILON = 1e-5


@dataclass(frozen=True)
class OutputRequest:
    """What the request asks for. `requested` is T (None when omitted); `param` names the field that gave it."""

    max_model_len: int
    requested: int | None
    param: str = "max_tokens"
    min_tokens: int = 0
    truncate_prompt_tokens: int | None = None
    generative: bool = False  # chat and Responses: 0.33 builds their TokenizeParams with max_output_tokens None


@dataclass(frozen=True)
class PromptShape:
    """A prompt as the length rules see it. `chars` is None for token-id prompts, which skip the text checks."""

    tokens: int
    chars: int | None
    max_chars_per_token: int


def reserved_output(request: OutputRequest) -> int:
    # vLLM builds TokenizeParams with `max_output_tokens or 0`.
    return request.requested or 0


def input_limit(profile: Profile, request: OutputRequest) -> int:
    """L: the longest prompt the renderer accepts."""
    if profile.reserves_output:
        return request.max_model_len - reserved_output(request)
    return request.max_model_len


def check_request(profile: Profile, request: OutputRequest) -> ApiError | None:
    """The checks vLLM runs before rendering or tokenizing anything."""
    m, t = request.max_model_len, reserved_output(request)
    if t > m:
        return validation_error(
            f"{request.param}={t} cannot be greater than max_model_len={m}. Please request fewer output tokens.",
            parameter=request.param,
            value=t,
        )
    k = request.truncate_prompt_tokens
    limit = input_limit(profile, request)
    if k is not None and k > limit:
        bound = f"max_model_len - {request.param} = {limit}" if profile.reserves_output else f"max_model_len = {m}"
        return validation_error(
            f"truncate_prompt_tokens={k} cannot be greater than {bound}. Please request a smaller truncation size.",
            parameter="truncate_prompt_tokens",
            value=k,
        )
    return None


def truncation_length(profile: Profile, request: OutputRequest) -> int | None:
    """How many tokens truncate_prompt_tokens keeps (the last ones), or None when it is unset."""
    k = request.truncate_prompt_tokens
    if k is None or k >= 0:
        return k
    limit = input_limit(profile, request)
    if profile.cuts_short_unlimited and request.generative and request.requested is None:
        return max(0, limit - 1)  # 0.33: no output limit is no longer "0 output tokens" (TokenizeParams)
    if profile.reserves_output or reserved_output(request) == 0:
        return limit
    return max(0, limit - 1)  # 0.32 holds one token back for output


def check_prompt_text(profile: Profile, request: OutputRequest, shape: PromptShape) -> ApiError | None:
    """The character pre-check: more characters than L tokens could possibly hold."""
    if shape.chars is None or request.truncate_prompt_tokens is not None:
        return None
    m, limit = request.max_model_len, input_limit(profile, request)
    most = limit * shape.max_chars_per_token
    if shape.chars <= most:
        return None
    c = shape.chars
    if profile.reserves_output:
        message = (
            f"This model's maximum context length is {m} tokens. However, you requested "
            f"{reserved_output(request)} output tokens and your prompt contains {c} characters (more than "
            f"{most} characters, which is the upper bound for {limit} input tokens). Please reduce the length "
            "of the input prompt or the number of requested output tokens."
        )
    else:
        message = (
            f"This model's maximum context length is {m} tokens. However, your prompt contains {c} characters "
            f"(more than {most} characters, which is the upper bound for {limit} input tokens). Please reduce "
            "the length of the input prompt."
        )
    return validation_error(message, parameter="input_text", value=c)


def counted_prompt_tokens(profile: Profile, request: OutputRequest, shape: PromptShape) -> int:
    """N as vLLM sees it: text is tokenized with truncation at L + 1 (or at the truncation length)."""
    keep = truncation_length(profile, request)
    if keep is not None:
        return min(shape.tokens, keep)
    if shape.chars is not None:
        return min(shape.tokens, input_limit(profile, request) + 1)
    return shape.tokens


def check_prompt_tokens(profile: Profile, request: OutputRequest, counted: int) -> ApiError | None:
    m, limit = request.max_model_len, input_limit(profile, request)
    if counted <= limit:
        return None
    q = "at least " if counted == limit + 1 else ""
    if profile.reserves_output:
        t = reserved_output(request)
        message = (
            f"This model's maximum context length is {m} tokens. However, you requested {t} output tokens and "
            f"your prompt contains {q}{counted} input tokens, for a total of {q}{counted + t} tokens. Please "
            "reduce the length of the input prompt or the number of requested output tokens."
        )
    else:
        message = (
            f"This model's maximum context length is {m} tokens. However, your prompt contains {q}{counted} "
            "input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
            "of the input prompt."
        )
    return validation_error(message, parameter="input_tokens", value=counted)


def check_prompt(profile: Profile, request: OutputRequest, shape: PromptShape) -> int | ApiError:
    """The renderer's checks on one prompt: the error, or the prompt length the engine gets."""
    error = check_prompt_text(profile, request, shape)
    if error is not None:
        return error
    counted = counted_prompt_tokens(profile, request, shape)
    return check_prompt_tokens(profile, request, counted) or counted


def budget(request: OutputRequest, prompt_tokens: int) -> int | ApiError:
    """vLLM's get_max_tokens: the request's value (or the room left when omitted), never past the window."""
    m = request.max_model_len
    if prompt_tokens > m:
        return ApiError(f"Input length ({prompt_tokens}) exceeds model's maximum context length ({m}).")
    room = m - prompt_tokens
    return room if request.requested is None else min(room, request.requested)


def check_sampling(max_tokens: int, min_tokens: int, n: int, temperature: float | None) -> ApiError | None:
    """SamplingParams' own checks, in its order (they run after the length rules)."""
    if n < 1:
        return ApiError(f"n must be at least 1, got {n}.")
    if n > MAX_N_SEQUENCES:
        return ApiError(
            f"n must be at most {MAX_N_SEQUENCES}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable."
        )
    t = 1.0 if temperature is None else temperature
    if t < 0.0:
        return validation_error(f"temperature must be non-negative, got {t}.", parameter="temperature", value=t)
    if t > 2.0:
        return validation_error(f"temperature must be in [0, 2], got {t}.", parameter="temperature", value=t)
    if max_tokens < 1:
        return validation_error(
            f"max_tokens must be at least 1, got {max_tokens}.", parameter="max_tokens", value=max_tokens
        )
    if min_tokens < 0:
        return ApiError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        return ApiError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    if t < _GREEDY_EPSILON and n > 1:
        return ApiError(f"n must be 1 when using greedy sampling, got {n}.")
    return None


@dataclass(frozen=True)
class Budget:
    prompt_tokens: int
    max_tokens: int


def resolve_max_tokens(
    profile: Profile,
    request: OutputRequest,
    shape: PromptShape,
    *,
    n: int = 1,
    temperature: float | None = None,
) -> Budget | ApiError:
    """Every rule for a single prompt, in vLLM's order: the first error, or what the engine will run."""
    error = check_request(profile, request)
    if error is not None:
        return error
    counted = check_prompt(profile, request, shape)
    if isinstance(counted, ApiError):
        return counted
    max_tokens = budget(request, counted)
    if isinstance(max_tokens, ApiError):
        return max_tokens
    return check_sampling(max_tokens, request.min_tokens, n, temperature) or Budget(counted, max_tokens)
