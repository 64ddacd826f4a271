"""The pure decision: from the prompt's token count and the request's output limit, make a plan.

    pass    forward the client's bytes unchanged
    clamp   forward with the output-limit field(s) lowered to what fits (min_tokens lowered with them): in the window,
            and in the KV budget (with admission.max_inflight_tokens, a request whose sequences with their output
            would hold more than a replica's whole budget has its output limit lowered, or set, so that they fit);
            on a route with a next-turn share (policy.next_turn_share_*), with that share of the window kept free
            for the next turn, at most half the room the prompt leaves: an agent whose answer fills its limit
            re-sends the conversation with that answer appended, which must fit too (Limits.next_turn_cap)
    reject  answer 400 context_length_exceeded without touching the upstream; or 400 request_too_large when the
            prompt alone (times n) leaves no room in the KV budget: such a request could never be admitted

Overflow policies other than reject (truncate, chunk) slot in as further plan kinds decided here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.api.routes import Reads
from proxy.errors import ContextLengthExceeded, NotReady, RequestTooLarge
from proxy.policy import token_budget
from proxy.settings import PolicySettings


class Action(StrEnum):
    """What the guard did with a request (x-token-guard-action; a plan's is one of the first three)."""

    PASS = "pass"  # forwarded as sent
    CLAMP = "clamp"  # its output limit lowered to fit
    REJECT = "reject"  # refused
    TRUNCATE = "truncate"  # its prompt cut to fit (overflow.py, converted.py)
    CHUNK = "chunk"  # its prompt split, each chunk its own request
    PARTIAL = "partial"  # counted in part (a lower bound): stored or media parts the guard cannot see
    COUNT = "count"  # counted only: a count or render route
    UNCOUNTED = "uncounted"  # neither the guard nor the upstream could count it: forwarded as sent


@dataclass(frozen=True)
class Limits:
    max_model_len: int
    min_output_tokens: int = 1
    default_max_tokens: int | str | None = None
    max_output: int | None = None  # the API key's max_output_tokens: a cap on every output limit
    max_cost: int | None = None  # the most KV tokens one request may hold: the largest replica's whole budget
    next_turn: float = 0.0  # the share of the window a clamp keeps free for the next turn (policy.next_turn_share_*)

    def window(self, sequences: int) -> int:
        """The most tokens each of a request's `sequences` may hold: the model's window, or less where the KV budget
        they share is smaller (admission could never take more, not even alone)."""
        if self.max_cost is None:
            return self.max_model_len
        return min(self.max_model_len, self.max_cost // max(1, sequences))

    def cap(self, room: int) -> int:
        """The most output a request may ask for: the room its prompt leaves, and the key's cap."""
        return room if self.max_output is None else min(room, self.max_output)

    def next_turn_cap(self, prompt_tokens: int, cap: int) -> int:
        """The most output a clamp leaves with `next_turn` of the window kept free for the next turn: never more than
        half the room the prompt leaves is kept (the answer gets the other half), nor the answer held below
        min_output_tokens. An agent's continuation after a length stop is the conversation plus the answer: it fits
        in what was kept."""
        if not self.next_turn:
            return cap
        room = self.max_model_len - prompt_tokens
        keep = min(int(self.next_turn * self.max_model_len), room // 2)
        return min(cap, max(room - keep, self.min_output_tokens))

    def unsaid_output(self, cap: int) -> int | None:
        """The output limit of a request that sets none: default_max_tokens, else the key's cap, else None (the
        upstream picks)."""
        default = self.default_output()
        return default if default is not None or self.max_output is None else cap

    def default_output(self) -> int | None:
        if isinstance(self.default_max_tokens, str):
            return max(1, int(self.max_model_len * float(self.default_max_tokens.rstrip("%")) / 100))
        return self.default_max_tokens


def limits_for(
    model: str, max_model_len: int | None, policy: PolicySettings, max_output: int | None = None,
    max_cost: int | None = None,
) -> Limits:  # fmt: skip
    """A model's limits under its policy (the API key's output cap, the KV budget's ceiling); 503 while its window
    is not known yet (discovery still running)."""
    if max_model_len is None:
        raise NotReady(f"token-guard does not know max_model_len for model `{model}` yet.")
    return Limits(max_model_len, policy.min_output_tokens, policy.default_max_tokens, max_output, max_cost)


# the setting of each route's share; a table built once (each access to an enum's member costs ~0.1-0.2 us on 3.11)
NEXT_TURN_SHARES: dict[str, str] = {
    Reads.MESSAGES: "next_turn_share_messages", Reads.RESPONSES: "next_turn_share_responses",
    Reads.CHAT: "next_turn_share_chat",
}  # fmt: skip


def next_turn_share(policy: PolicySettings, reads: str) -> float:
    """The share of the window a clamp keeps free for the next turn on a route that reads `reads`."""
    setting = NEXT_TURN_SHARES.get(reads)
    return float(getattr(policy, setting)) if setting is not None else 0.0


@dataclass(frozen=True)
class Plan:
    action: Action
    prompt_tokens: int
    max_tokens: int | None = None
    changes: dict[str, int] = field(default_factory=dict)
    error: ContextLengthExceeded | RequestTooLarge | None = None
    next_turn: int | None = None  # the tokens of the window kept free for the next turn, when that lowered the limit

    def cost(self, limits: Limits, sequences: int) -> int:
        """KV tokens the request holds while it runs: (prompt + output limit) per sequence; with no limit, vLLM
        may fill the window."""
        output = self.max_tokens if self.max_tokens is not None else limits.max_model_len - self.prompt_tokens
        return (self.prompt_tokens + output) * sequences


def decide_chat(req: ChatRequest, prompt_tokens: int, limits: Limits) -> Plan:
    room = _room(prompt_tokens, limits, req.n, "messages")
    if isinstance(room, Plan):
        return room
    cap, requested = limits.next_turn_cap(prompt_tokens, limits.cap(room)), req.requested_output
    if requested is None:
        default = limits.unsaid_output(cap)
        if default is None and cap < limits.max_model_len - prompt_tokens:  # vLLM would fill the window: too much
            default = cap
        if default is None:  # the upstream picks the output limit (vLLM: whatever room is left)
            return Plan(Action.PASS, prompt_tokens)
        plan = _limited(prompt_tokens, min(default, cap), {"max_tokens": min(default, cap)}, req.min_tokens)
        return _kept(plan, limits, room)
    sent = {"max_tokens": req.max_tokens, "max_completion_tokens": req.max_completion_tokens}
    changes = {name: cap for name, value in sent.items() if value is not None and value > cap}
    limit = min(requested[1], cap)
    changes |= token_budget.followed(req.body, requested[1], limit)
    return _kept(_limited(prompt_tokens, limit, changes, req.min_tokens), limits, room)


def decide_completion(req: CompletionRequest, prompt_tokens: list[int], limits: Limits) -> Plan:
    # A batch is clamped for its longest prompt, so that every prompt in it fits.
    longest = max(prompt_tokens)
    room = _room(longest, limits, req.n * len(prompt_tokens), "prompt")
    if isinstance(room, Plan):
        return room
    _, requested = req.requested_output  # vLLM's default of 16 counts when the field is absent
    cap = limits.cap(room)
    changes = {"max_tokens": cap} if requested > cap else {}
    changes |= token_budget.followed(req.body, requested, min(requested, cap))
    return _limited(longest, min(requested, cap), changes, req.min_tokens)


def decide_output(
    prompt_tokens: int, limits: Limits, field: str, requested: int | None, param: str, sequences: int = 1
) -> Plan:
    """The chat rules for a request with one output-limit field (Responses `max_output_tokens`, Anthropic
    `max_tokens`, token-in generate's `max_tokens`); `param` is what a rejection names."""
    room = _room(prompt_tokens, limits, sequences, param)
    if isinstance(room, Plan):
        return room
    cap = limits.next_turn_cap(prompt_tokens, limits.cap(room))
    if requested is None:
        requested = limits.unsaid_output(cap)
        if requested is None and cap < limits.max_model_len - prompt_tokens:  # budget or next turn binds: say it
            requested = cap
        if requested is None:  # the upstream picks the output limit (vLLM: whatever room is left)
            return Plan(Action.PASS, prompt_tokens)
        return _kept(Plan(Action.CLAMP, prompt_tokens, min(requested, cap), {field: min(requested, cap)}), limits, room)
    return _kept(_limited(prompt_tokens, min(requested, cap), {field: cap} if requested > cap else {}, None), limits,
                 room)  # fmt: skip


def _room(prompt_tokens: int, limits: Limits, sequences: int, param: str) -> int | Plan:
    """The output each sequence has room for, or the reject plan when it is below min_output_tokens: for the window
    (the overflow policies may cut the prompt), or for the KV budget (nothing can be admitted: refused outright)."""
    room = limits.max_model_len - prompt_tokens
    if room < limits.min_output_tokens:
        return Plan(Action.REJECT, prompt_tokens, error=_too_long(prompt_tokens, room, limits, param))
    budgeted = limits.window(sequences) - prompt_tokens
    if budgeted < limits.min_output_tokens:
        return Plan(Action.REJECT, prompt_tokens, error=_over_budget(prompt_tokens, sequences, limits, param))
    return budgeted


def _kept(plan: Plan, limits: Limits, room: int) -> Plan:
    """A clamp whose limit the next turn's share lowered says how much of the window it keeps free."""
    if plan.action is not Action.CLAMP or plan.max_tokens is None or plan.max_tokens >= limits.cap(room):
        return plan
    return replace(plan, next_turn=limits.max_model_len - plan.prompt_tokens - plan.max_tokens)


def _limited(prompt_tokens: int, limit: int, changes: dict[str, int], min_tokens: int | None) -> Plan:
    if min_tokens is not None and min_tokens > limit:
        changes = {**changes, "min_tokens": limit}
    return Plan(Action.CLAMP if changes else Action.PASS, prompt_tokens, limit, changes)


def reject_at_least(floor: int, limits: Limits, param: str) -> Plan:
    """A prompt whose size alone proves it cannot fit (at least `floor` tokens), refused before it is counted."""
    room = limits.max_model_len - floor
    return Plan(Action.REJECT, floor, error=_too_long(floor, room, limits, param, at_least=True))


def _over_budget(prompt_tokens: int, sequences: int, limits: Limits, param: str) -> RequestTooLarge:
    need = (prompt_tokens + limits.min_output_tokens) * sequences
    times = f" for each of {sequences} sequences" if sequences > 1 else ""
    return RequestTooLarge(
        f"This request needs at least {need} tokens of KV cache ({prompt_tokens} input tokens and "
        f"{limits.min_output_tokens} output{times}), more than the upstream's whole admission budget of "
        f"{limits.max_cost} tokens (admission.max_inflight_tokens): it could never be admitted. Send a shorter prompt"
        f"{', or fewer sequences (n, or prompts in a batch)' if sequences > 1 else ''}.",
        param=param,
    )


def _too_long(
    prompt_tokens: int, room: int, limits: Limits, param: str, at_least: bool = False
) -> ContextLengthExceeded:
    # "prompt is too long" is one of the phrases LangChain recognizes a context overflow by (it reads the message only,
    # not the code); "maximum context length is" is the one LiteLLM and vLLM's clients look for.
    plural = "" if limits.min_output_tokens == 1 else "s"
    needed = f"at least {limits.min_output_tokens} output token{plural}"
    message = (
        f"This model's maximum context length is {limits.max_model_len} tokens. However, your request has "
        f"{'at least ' if at_least else ''}{prompt_tokens} input tokens, which leaves {max(room, 0)} for the output "
        f"({needed} required). "
        f"The prompt is too long: please reduce the length of the {param}."
    )
    return ContextLengthExceeded(message, param=param)
