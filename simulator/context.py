"""What every endpoint handler shares: the loaded settings, profile and tokenizer, plus the small checks vLLM
runs the same way on every endpoint (served model, response ids, stream options, engine-side prompt checks)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from simulator.errors import ApiError, not_found_model, validation_error
from simulator.harmony import SimHarmony, is_harmony
from simulator.profiles import Profile, get_profile
from simulator.settings import SimulatorSettings
from simulator.stored import ResponseStore
from simulator.tokenizer import SimTokenizer

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    settings: SimulatorSettings
    profile: Profile
    tokenizer: SimTokenizer
    fingerprint: str
    store: ResponseStore | None = None  # VLLM_ENABLE_RESPONSES_API_STORE: this replica's Responses store
    harmony: SimHarmony | None = None  # a gpt-oss model: Responses rendered with openai_harmony

    @classmethod
    def load(cls, settings: SimulatorSettings) -> Context:
        profile = get_profile(settings.profile)
        tokenizer = SimTokenizer.load(settings.tokenizer, settings.chat_template, profile.follows_namespace_aliases,
                                      profile.reads_processor_default)  # fmt: skip
        seed = f"{settings.model}|{settings.max_model_len}|{settings.model_root}|{settings.profile}"
        digest = hashlib.sha256(seed.encode()).hexdigest()[:8]
        fingerprint = f"vllm-{settings.vllm_version}-{digest}"
        store = ResponseStore() if settings.responses_store else None
        harmony = SimHarmony(profile.keeps_empty_reasoning) if is_harmony(settings.tokenizer) else None
        return cls(settings, profile, tokenizer, fingerprint, store, harmony)

    def check_model(self, model: str | None) -> None:
        """An omitted or empty model means the served one; anything else must be its name."""
        if model and model not in self.settings.served:
            aliases = list(self.settings.served) if self.profile.lists_aliases_on_not_found else None
            raise not_found_model(model, aliases)


def response_id(prefix: str, headers: Mapping[str, str], body_request_id: str | None) -> str:
    """vLLM: the X-Request-Id header wins, then the body's request_id, then 16 random hex digits."""
    suffix = headers.get("x-request-id") or body_request_id or f"{uuid.uuid4().int & (2**64 - 1):016x}"
    return f"{prefix}-{suffix}"


def check_stream_options(body: Mapping[str, Any]) -> None:
    if body.get("stream_options") and not body.get("stream"):
        raise validation_error("Stream options can only be defined when `stream=True`.", parameter="stream_options")


def usage_flags(stream: bool, stream_options: Mapping[str, Any] | None) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats); both default to false since 0.18."""
    if not stream or stream_options is None:
        return False, False
    include = bool(stream_options.get("include_usage"))
    return include, include and bool(stream_options.get("continuous_usage_stats"))


def engine_error(ctx: Context, token_ids: list[int]) -> ApiError | None:
    """Checks the engine runs when it receives the prompt, after the HTTP layer has accepted the request."""
    if not token_ids:
        return validation_error("The decoder prompt cannot be empty")
    highest = max(token_ids)
    if highest > ctx.tokenizer.max_token_id:
        return validation_error(f"Token id {highest} is out of vocabulary")
    return None


def raise_if(error: ApiError | None) -> None:
    if error is not None:
        raise error


def unwrap(value: T | ApiError) -> T:
    if isinstance(value, ApiError):
        raise value
    return value
