"""The simulator's one settings object: built once, validated once, passed to `create_app`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simulator.profiles import get_profile


@dataclass(frozen=True)
class SimulatorSettings:
    tokenizer: Path
    model: str = "tiny"
    aliases: tuple[str, ...] = ()  # more served names of the model (vLLM's --served-model-name tiny other)
    max_model_len: int = 2048
    profile: str = "0.32"
    chat_template: Path | None = None
    ttft_s: float = 0.0
    itl_s: float = 0.0
    root: str | None = None
    version: str | None = None
    # The KV cache in tokens: over it, every running sequence slows down (preemption); None = unlimited.
    kv_capacity_tokens: int | None = None
    trust_request_chat_template: bool = False  # as vLLM's --trust-request-chat-template
    reasoning_parser: str | None = None  # as vLLM's --reasoning-parser: without one, a thinking budget is refused
    max_num_queued_reqs: int | None = None  # as vLLM's --max-num-queued-reqs: over it, 503 "the engine is busy"
    enable_prompt_embeds: bool = False  # as vLLM's --enable-prompt-embeds: completions take prompt_embeds
    hidden_size: int = 64  # the model's, which each prompt_embeds tensor must have
    responses_store: bool = False  # as VLLM_ENABLE_RESPONSES_API_STORE=1: stored Responses, background mode
    reasoning_effort_map: dict[str, str] | None = None  # as vLLM's --reasoning-effort-map (0.33+)
    enable_scale_out: bool = False  # as vLLM's --enable-scale-out: the render routes (render.py) are served

    def __post_init__(self) -> None:
        get_profile(self.profile)
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}")
        if self.ttft_s < 0 or self.itl_s < 0:
            raise ValueError("ttft_s and itl_s must not be negative")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be at least 1, got {self.kv_capacity_tokens}")
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 0:
            raise ValueError(f"max_num_queued_reqs must not be negative, got {self.max_num_queued_reqs}")
        if not self.model:
            raise ValueError("model must not be empty")

    @property
    def served(self) -> tuple[str, ...]:
        """Every name the model answers to; the first is the one answers carry."""
        return (self.model, *self.aliases)

    @property
    def vllm_version(self) -> str:
        """The version /version reports: the explicit override, else the profile's release."""
        return self.version or get_profile(self.profile).version

    @property
    def model_root(self) -> str:
        return self.root if self.root is not None else str(self.tokenizer)
