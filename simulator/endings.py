"""How a sequence ends when the request constrains its output, by vLLM's rules: stop strings and stop token ids
(its incremental detokenizer: the match is cut from the text unless include_stop_str_in_output, streamed text is held
back by the longest stop string less one character, no check before min_tokens), and text that guided decoding forces
(a named tool's arguments, a `json_schema` response), which ends with EOS: finish_reason "stop" once it is complete,
"length" if max_tokens cuts it first. Unconstrained requests keep the plain filler and never come here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from simulator.errors import ApiError
from simulator.generation import Generation, Piece, Sequence, sequences, token_at
from simulator.tokenizer import SimTokenizer
from simulator.wire import Fields


@dataclass(frozen=True)
class OutputRules:
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    forced: str | None = None  # the text guided decoding makes the model write, then EOS

    @property
    def active(self) -> bool:
        return bool(self.stop or self.stop_token_ids) or self.forced is not None


def read_stops(fields: Fields, min_tokens: int) -> OutputRules:
    """`stop` (a string or a list of them), `stop_token_ids` and `include_stop_str_in_output`, typed like vLLM's."""
    stop = fields.raw("stop")
    strings: list[str] = []
    if isinstance(stop, str):
        strings = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        strings = list(stop)
    elif stop is not None:
        fields.invalid("body.stop", "union_type", "Input should be a valid string or a list of strings", stop)
    ids = fields.raw("stop_token_ids")
    token_ids = fields.ints("stop_token_ids", ids) if isinstance(ids, list) else []
    if ids is not None and not isinstance(ids, list):
        fields.invalid("body.stop_token_ids", "list_type", "Input should be a valid list", ids)
    include = fields.boolean("include_stop_str_in_output", False)
    return OutputRules(tuple(strings), frozenset(token_ids), include, min_tokens)


def check_stops(rules: OutputRules) -> None:
    """SamplingParams' own check, after the length rules."""
    if any(not s for s in rules.stop):
        raise ApiError("stop cannot contain an empty string.")


def with_endings(generation: Generation, tokenizer: SimTokenizer, rules: OutputRules) -> Generation:
    """The generation with each sequence's tokens, streamed text and finish decided up front (it is deterministic)."""
    if not rules.active:
        return generation
    forced = _forced_steps(tokenizer, rules.forced) if rules.forced is not None else None
    ended = []
    for seq in sequences(generation):
        steps = iter(forced) if forced is not None else _filler_steps(tokenizer.pieces, seq)
        ended.append(_run(seq, steps, rules))
    return replace(generation, scripted=tuple(ended))


# One generated token: its id, its text, and whether it is the EOS that ends forced text.
_Step = tuple[int, str, bool]


def _filler_steps(pieces: list[Piece], seq: Sequence) -> Iterator[_Step]:
    for position in itertools.count():
        token_id, text = token_at(pieces, seq, position)
        yield token_id, text, False


def _forced_steps(tokenizer: SimTokenizer, text: str) -> list[_Step]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [(token_id, tokenizer.decode([token_id]), False) for token_id in ids] + [(tokenizer.eos_token_id, "", True)]


def _run(seq: Sequence, steps: Iterator[_Step], rules: OutputRules) -> Sequence:
    hold = 0 if rules.include_stop_str_in_output else max((len(s) for s in rules.stop), default=1) - 1
    script: list[Piece] = []
    text, sent = "", 0
    finish: str = "length"
    reason: str | int | None = None
    for count, (token_id, piece, eos) in enumerate(steps, start=1):
        checked = count > rules.min_tokens  # vLLM checks no stop before min_tokens
        if eos or (checked and token_id in rules.stop_token_ids):
            finish, reason = "stop", (None if eos else token_id)
            text += piece if rules.include_stop_str_in_output else ""
        else:
            text += piece
            matched = _stop_string(text, len(piece), rules) if checked else None
            if matched is not None:
                finish, reason = "stop", matched[0]
                text = text if matched[1] == -1 else text[: matched[1]]
        done = finish == "stop" or count == seq.max_tokens
        upto = len(text) if done else max(len(text) - hold, sent)
        script.append((token_id, text[sent:upto]))
        sent = upto
        if done:
            break
    return replace(seq, max_tokens=len(script), finish_reason=finish, stop_reason=reason, script=tuple(script))


def _stop_string(text: str, new_chars: int, rules: OutputRules) -> tuple[str, int] | None:
    """vLLM's StopChecker.check_stop_strings: (the stop string, where to cut the text, -1 for nowhere)."""
    if not new_chars:
        return None
    for stop in rules.stop:
        index = text.find(stop, 1 - new_chars - len(stop))
        if index == -1:
            continue
        if rules.include_stop_str_in_output:
            index += len(stop)
            if index >= len(text):
                return stop, -1
        return stop, index
    return None
