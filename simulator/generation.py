"""The fake engine: a plan of what to generate, and deterministic tokens paced by TTFT and inter-token latency.

Every sequence runs to exactly its max_tokens (finish_reason "length"): that is what a random-weight model
does on a real vLLM, and it makes usage.completion_tokens equal the effective max_tokens. The exceptions are requests
that constrain the output (stop strings or token ids, a forced tool call or JSON schema): `endings.py` decides those
sequences' tokens and finish up front and puts them in `Generation.scripted`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from simulator.errors import ApiError
from simulator.kv import KvCache

Piece = tuple[int, str]


@dataclass(frozen=True)
class PromptPlan:
    token_ids: list[int]
    max_tokens: int
    # Completions with echo: the prompt text put in front of the output; `echo_only` when max_tokens was 0.
    echo_text: str | None = None
    echo_only: bool = False


@dataclass(frozen=True)
class Generation:
    """Everything the response builders need, decided before the first byte is sent."""

    endpoint: Literal["chat", "completion", "responses", "messages", "generate"]
    response_id: str
    created: int
    model: str
    prompts: list[PromptPlan]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    role: str = "assistant"
    roles: tuple[str, ...] = ()  # batch chat: each conversation's response role (else `role` for every choice)
    chat_echo: str | None = None
    # Checks the engine itself runs (empty prompt, unknown token id): a 400 before a non-stream answer, an SSE
    # error event after the 200 of a stream.
    engine_error: ApiError | None = None
    # A named tool_choice: each choice's output is that tool's arguments, answered as a tool call.
    tool_call: ForcedTool | None = None
    # The sequences, when the request constrains how they end (see endings.py); None: plain filler to max_tokens.
    scripted: tuple[Sequence, ...] | None = None
    # Responses and Anthropic Messages answers echo fields of the request (instructions, tools, temperature...)
    request: Mapping[str, Any] | None = None
    # A Responses answer vLLM stores: handed the response once it is complete (stored.py)
    keep: Callable[[dict[str, Any]], None] | None = None
    # A Responses stream ends an incomplete response with response.incomplete (0.33+), else response.completed
    ends_incomplete: bool = False
    # A Responses answer echoes the request's prompt_cache_* and safety_identifier (0.33+)
    echoes_prompt_cache: bool = False

    @property
    def kv_tokens(self) -> int:
        """What the request holds in the KV cache while it runs: prompt + max_tokens for each of its sequences."""
        return self.n * sum(len(p.token_ids) + p.max_tokens for p in self.prompts)


@dataclass(frozen=True)
class Engine:
    """The fake engine's fixed inputs: the token pieces it cycles through, its pacing, and the KV cache whose
    oversubscription slows every step (None: no capacity, nothing slows)."""

    pieces: list[Piece]
    ttft_s: float = 0.0
    itl_s: float = 0.0
    kv: KvCache | None = None

    @property
    def instant(self) -> bool:
        return self.ttft_s == 0 and self.itl_s == 0

    def slowdown(self) -> float:
        return 1.0 if self.kv is None else self.kv.slowdown()


@dataclass(frozen=True)
class ForcedTool:
    name: str
    ids: tuple[str, ...]  # one tool-call id per choice


@dataclass(frozen=True)
class Sequence:
    index: int
    prompt: int
    max_tokens: int  # the tokens it generates
    finish_reason: str = "length"
    stop_reason: str | int | None = None
    script: tuple[Piece, ...] | None = None  # each token's id and the text streamed with it; None: the filler


@dataclass(frozen=True)
class Token:
    sequence: Sequence
    token_id: int
    text: str
    position: int

    @property
    def last(self) -> bool:
        return self.position == self.sequence.max_tokens - 1


def sequences(generation: Generation) -> list[Sequence]:
    """Choices in vLLM's order: prompt by prompt, then output index; index = prompt * n + output."""
    if generation.scripted is not None:
        return list(generation.scripted)
    return [
        Sequence(index=p * generation.n + j, prompt=p, max_tokens=prompt.max_tokens)
        for p, prompt in enumerate(generation.prompts)
        for j in range(generation.n)
    ]


def token_at(pieces: list[Piece], sequence: Sequence, position: int) -> Piece:
    if sequence.script is not None:
        return sequence.script[position]
    # Offsetting by the choice index makes the n choices of one request differ, still deterministically.
    return pieces[(position + 3 * sequence.index) % len(pieces)]


def output_of(pieces: list[Piece], sequence: Sequence) -> tuple[list[int], str]:
    chosen = [token_at(pieces, sequence, k) for k in range(sequence.max_tokens)]
    return [token_id for token_id, _ in chosen], "".join(text for _, text in chosen)


def duration(seqs: list[Sequence], engine: Engine) -> float:
    longest = max((s.max_tokens for s in seqs), default=0)
    return 0.0 if longest == 0 else engine.ttft_s + engine.itl_s * (longest - 1)


def generated_by(seqs: list[Sequence], engine: Engine, elapsed_s: float) -> int:
    """The tokens the sequences had produced `elapsed_s` into their run, at the engine's pace (no KV slowdown)."""
    if elapsed_s < engine.ttft_s:
        return 0
    longest = max((s.max_tokens for s in seqs), default=0)
    done = longest if engine.itl_s == 0 else 1 + int((elapsed_s - engine.ttft_s) / engine.itl_s)
    return sum(min(s.max_tokens, done) for s in seqs)


async def steps(seqs: list[Sequence], engine: Engine) -> AsyncIterator[list[Token]]:
    """One engine step at a time: every unfinished sequence produces one token per step."""
    longest = max((s.max_tokens for s in seqs), default=0)
    for position in range(longest):
        delay = (engine.ttft_s if position == 0 else engine.itl_s) * engine.slowdown()
        if delay > 0:
            await anyio.sleep(delay)
        step = []
        for seq in seqs:
            if position < seq.max_tokens:
                token_id, text = token_at(engine.pieces, seq, position)
                step.append(Token(sequence=seq, token_id=token_id, text=text, position=position))
        yield step
