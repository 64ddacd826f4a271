"""The context-window rules of each vLLM profile, as pure functions, with vLLM's exact messages."""

from __future__ import annotations

import pytest

from simulator.errors import ApiError
from simulator.limits import Budget, OutputRequest, PromptShape, check_sampling, resolve_max_tokens, truncation_length
from simulator.profiles import Profile, get_profile

V031 = get_profile("0.31")
V032 = get_profile("0.32")
V033 = get_profile("0.33")
M = 2048
CPT = 128  # the demo tokenizer's longest vocabulary string


def text(tokens: int, chars: int = 100) -> PromptShape:
    return PromptShape(tokens=tokens, chars=chars, max_chars_per_token=CPT)


def ids(tokens: int) -> PromptShape:
    return PromptShape(tokens=tokens, chars=None, max_chars_per_token=CPT)


def error_of(result: Budget | ApiError) -> ApiError:
    assert isinstance(result, ApiError), f"expected an error, got {result}"
    return result


@pytest.mark.parametrize("profile", [V031, V032])
@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_requested_output_larger_than_the_window(profile: Profile, param: str) -> None:
    error = error_of(resolve_max_tokens(profile, OutputRequest(M, 3000, param), text(5)))
    assert error.message == (
        f"{param}=3000 cannot be greater than max_model_len=2048. Please request fewer output tokens. "
        f"(parameter={param}, value=3000)"
    )
    assert (error.status, error.type, error.param) == (400, "BadRequestError", param)


def test_031_text_prompt_over_the_reserved_window_reports_at_least() -> None:
    # vLLM tokenizes text with truncation at L + 1 = 49 tokens, so it can only say "at least 49".
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 2000), text(3001)))
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, you requested 2000 output tokens and your "
        "prompt contains at least 49 input tokens, for a total of at least 2049 tokens. Please reduce the length "
        "of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=49)"
    )
    assert error.param == "input_tokens"


def test_031_token_prompt_reports_its_real_length() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 2000), ids(60)))
    assert "your prompt contains 60 input tokens, for a total of 2060 tokens." in error.message
    assert error.message.endswith("(parameter=input_tokens, value=60)")


def test_031_token_prompt_one_over_the_limit_still_says_at_least() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 2000), ids(49)))
    assert "contains at least 49 input tokens, for a total of at least 2049 tokens" in error.message


def test_031_prompt_exactly_filling_the_reserved_window_passes() -> None:
    assert resolve_max_tokens(V031, OutputRequest(M, 2000), text(48)) == Budget(prompt_tokens=48, max_tokens=2000)


def test_031_character_precheck() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 2000), text(10, chars=48 * CPT + 1)))
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, you requested 2000 output tokens and your "
        "prompt contains 6145 characters (more than 6144 characters, which is the upper bound for 48 input "
        "tokens). Please reduce the length of the input prompt or the number of requested output tokens. "
        "(parameter=input_text, value=6145)"
    )
    assert error.param == "input_text"


def test_031_chat_without_max_tokens_gets_the_rest_of_the_window() -> None:
    assert resolve_max_tokens(V031, OutputRequest(M, None), text(2000)) == Budget(2000, 48)


def test_031_chat_without_max_tokens_and_a_full_window() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, None), text(2048)))
    assert error.message == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"


def test_031_chat_without_max_tokens_and_an_overlong_prompt() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, None), text(5000)))
    assert "you requested 0 output tokens and your prompt contains at least 2049 input tokens, " in error.message
    assert "for a total of at least 2049 tokens." in error.message


def test_032_clamps_instead_of_rejecting() -> None:
    assert resolve_max_tokens(V032, OutputRequest(M, 2000), text(1000)) == Budget(1000, 1048)
    assert resolve_max_tokens(V032, OutputRequest(M, 100), text(1000)) == Budget(1000, 100)


def test_032_prompt_longer_than_the_window() -> None:
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 10), text(3001)))
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt. (parameter=input_tokens, value=2049)"
    )


def test_032_token_prompt_longer_than_the_window_reports_its_length() -> None:
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 10), ids(2100)))
    assert "your prompt contains 2100 input tokens, which exceeds" in error.message


def test_032_prompt_exactly_the_window() -> None:
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 10), text(2048)))
    assert error.message == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    assert error.param == "max_tokens"


def test_032_character_precheck() -> None:
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 10), text(10, chars=M * CPT + 1)))
    assert error.message == (
        "This model's maximum context length is 2048 tokens. However, your prompt contains 262145 characters "
        "(more than 262144 characters, which is the upper bound for 2048 input tokens). Please reduce the "
        "length of the input prompt. (parameter=input_text, value=262145)"
    )


def test_032_min_tokens_checked_against_the_clamped_value() -> None:
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 100, min_tokens=60), text(2000)))
    assert error.message == "min_tokens must be less than or equal to max_tokens=48, got 60."
    assert error.param is None


def test_031_min_tokens_above_max_tokens() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 10, min_tokens=11), text(5)))
    assert error.message == "min_tokens must be less than or equal to max_tokens=10, got 11."


def test_truncation_keeps_the_last_tokens_and_then_fits() -> None:
    assert resolve_max_tokens(V032, OutputRequest(M, 10, truncate_prompt_tokens=100), text(5000)) == Budget(100, 10)
    # -1 means "as many as fit": 0.31 keeps M - T, 0.32 keeps M - 1 so one token can still be generated.
    assert resolve_max_tokens(V031, OutputRequest(M, 48, truncate_prompt_tokens=-1), text(5000)) == Budget(2000, 48)
    assert resolve_max_tokens(V032, OutputRequest(M, 48, truncate_prompt_tokens=-1), text(5000)) == Budget(2047, 1)


def test_truncation_larger_than_allowed() -> None:
    error = error_of(resolve_max_tokens(V031, OutputRequest(M, 48, truncate_prompt_tokens=2001), text(5)))
    assert error.message == (
        "truncate_prompt_tokens=2001 cannot be greater than max_model_len - max_tokens = 2000. Please request a "
        "smaller truncation size. (parameter=truncate_prompt_tokens, value=2001)"
    )
    error = error_of(resolve_max_tokens(V032, OutputRequest(M, 48, truncate_prompt_tokens=2049), text(5)))
    assert error.message == (
        "truncate_prompt_tokens=2049 cannot be greater than max_model_len = 2048. Please request a smaller "
        "truncation size. (parameter=truncate_prompt_tokens, value=2049)"
    )


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens", "n", "temperature", "message"),
    [
        (5, 0, 0, None, "n must be at least 1, got 0."),
        (5, 0, 2, 0.0, "n must be 1 when using greedy sampling, got 2."),
        (5, 0, 1, -1.0, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"),
        (5, 0, 1, 2.5, "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)"),
        (5, -1, 1, None, "min_tokens must be greater than or equal to 0, got -1."),
        (-3, 0, 1, None, "max_tokens must be at least 1, got -3. (parameter=max_tokens, value=-3)"),
    ],
)
def test_sampling_checks(max_tokens: int, min_tokens: int, n: int, temperature: float | None, message: str) -> None:
    error = check_sampling(max_tokens, min_tokens, n, temperature)
    assert error is not None and error.message == message


def test_sampling_accepts_ordinary_requests() -> None:
    assert check_sampling(16, 0, 4, None) is None
    assert check_sampling(16, 16, 1, 0.0) is None


def test_minus_one_with_no_output_limit_is_refused_by_032_and_answers_one_token_on_033() -> None:
    chat = OutputRequest(M, None, truncate_prompt_tokens=-1, generative=True)
    error = error_of(resolve_max_tokens(V032, chat, text(5000)))
    assert error.message.startswith("max_tokens must be at least 1, got 0.")
    assert resolve_max_tokens(V033, chat, text(5000)) == Budget(2047, 1)
    pooled = OutputRequest(M, None, truncate_prompt_tokens=-1)  # no output: the whole window on both
    assert truncation_length(V033, pooled) == truncation_length(V032, pooled) == M
