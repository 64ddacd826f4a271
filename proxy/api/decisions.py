"""The Decisions request (`POST /v1/decisions`, vLLM 0.33 and later) as the guard reads it: every field checked as
vLLM's request model checks it, and each question written out as the user turn vLLM renders for it.

vLLM 0.33 / 0.34 (`openai/decisions/protocol.py` `DecisionRequest`, `adapters.py`, `question_types.py`): every object
forbids unknown fields (`extra="forbid"`) and reads strict strings and booleans. `model` is required; `input` is a
string or a list of user messages (a string or `input_text` parts as content, no images); `questions` holds 1 to 200
questions (the serving layer then allows 64), each a predicate, a choice (2 to 255 distinct string or boolean values,
of which the next-token models label 26, A to Z) or a score (2 to 10 levels). A question's prompt is the input's text,
a blank line, then "Question: <instructions>" (when there are any), one "<label>: <option>" line per option, and the
reply instruction: one chat user turn, rendered with thinking off and the generation prompt, one engine request with
`max_tokens=1` each. Duplicate keys in a body are read as vLLM reads them (json.loads: the last one wins)."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.api.body import kind_of
from proxy.errors import InvalidRequest

SHORT_TEXT, INPUT_TEXT = 1_048_576, 10_485_760  # the longest ShortText and InputText vLLM's model accepts
MAX_MESSAGES, MAX_PARTS = 131_072, 16_384
MIN_QUESTIONS, MOST_QUESTIONS, MAX_QUESTIONS = 1, 200, 64  # the model's bounds, then the serving layer's (per call)
LABELS = string.ascii_uppercase  # a next-token model reads at most 26 options, labelled A to Z
REPLY = "Answer with the letter of one option only."
CACHE_SALT_FORBIDDEN, CACHE_SALT_LONGEST = frozenset("@/\\\x00"), 128
FIELDS = frozenset({"model", "input", "questions", "safety_identifier", "joint", "cache_salt"})
QUESTION_FIELDS = {
    "predicate": frozenset({"type", "instructions", "name"}),
    "choice": frozenset({"type", "instructions", "name", "choices"}),
    "score": frozenset({"type", "instructions", "name", "levels"}),
}
JOINT_REFUSED = "joint: this model reads each question on its own; joint reads need DiffusionGemma"  # vLLM's words


@dataclass(frozen=True)
class Question:
    instructions: str
    options: tuple[tuple[str, str], ...]  # (name, description) in order


@dataclass(frozen=True)
class DecisionRequest:
    body: dict[str, Any]
    model: str | None  # "" is the served model, as vLLM's model check reads it
    text: str  # the input as the model reads it (adapters.input_text)
    questions: tuple[Question, ...]
    joint: bool

    def prompts(self) -> Iterator[str]:
        """Each question's user turn, in order, one at a time (each holds the whole input)."""
        for question in self.questions:
            yield f"{self.text}\n\n{question_prompt(question)}"


def decision_request(body: dict[str, Any]) -> DecisionRequest:
    _fields(body, FIELDS, "")
    model = _text(body, "model", SHORT_TEXT, "model", required=True)
    questions = body.get("questions")
    if not isinstance(questions, list) or not MIN_QUESTIONS <= len(questions) <= MOST_QUESTIONS:
        raise InvalidRequest(f"'questions' must be an array of {MIN_QUESTIONS} to {MOST_QUESTIONS} questions.",
                             param="questions")  # fmt: skip
    read = tuple(_question(q, f"questions[{i}]") for i, q in enumerate(questions))
    safety = body.get("safety_identifier")
    if safety is not None and (not isinstance(safety, str) or len(safety) > 128):
        raise InvalidRequest("'safety_identifier' must be a string of at most 128 characters.",
                             param="safety_identifier")  # fmt: skip
    joint = body.get("joint", False)
    if not isinstance(joint, bool):
        raise InvalidRequest(f"'joint' must be a boolean, got {kind_of(joint)}.", param="joint")
    _cache_salt(body.get("cache_salt"))
    return DecisionRequest(body, model or None, _input(body.get("input")), read, joint)


def check_serving(req: DecisionRequest) -> None:
    """What vLLM's serving layer refuses once the model is known, in its order (serving.py, adapters.py)."""
    if len(req.questions) > MAX_QUESTIONS:
        raise InvalidRequest(f"questions: at most {MAX_QUESTIONS} for this model", param="questions")
    if any(len(q.options) > len(LABELS) for q in req.questions):
        raise InvalidRequest(f"This model supports at most {len(LABELS)} choices per question", param="questions")
    if req.joint:
        raise InvalidRequest(JOINT_REFUSED, param="joint")


def question_prompt(question: Question) -> str:
    """question_types.QuestionType.prompt: the heading, one line per labelled option, the reply instruction."""
    lines = [f"{label}: {name} - {about}" if about else f"{label}: {name}"
             for label, (name, about) in zip(LABELS, question.options, strict=False)]  # fmt: skip
    body = "\n".join([*lines, REPLY])
    return f"Question: {question.instructions}\n{body}" if question.instructions else body


def _question(value: Any, where: str) -> Question:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind not in QUESTION_FIELDS:
        raise InvalidRequest(f"'{where}.type' must be one of predicate, choice or score.", param=f"{where}.type")
    assert isinstance(value, dict)
    _fields(value, QUESTION_FIELDS[kind], where)
    instructions = _text(value, "instructions", SHORT_TEXT, where, required=True)
    if "name" in value:
        _text(value, "name", SHORT_TEXT, where, required=True)  # a name sent as null is refused
    if kind == "predicate":
        return Question(instructions, (("false", ""), ("true", "")))
    if kind == "choice":
        return Question(instructions, _choices(value.get("choices"), f"{where}.choices"))
    return Question(instructions, _levels(value.get("levels"), f"{where}.levels"))


def _choices(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    items = _items(value, where, 2, 255, {"value", "description"})
    values = [item.get("value") for item in items]
    for i, choice in enumerate(values):
        if not isinstance(choice, str | bool):
            raise InvalidRequest(f"'{where}[{i}].value' must be a string or a boolean, got {kind_of(choice)}.",
                                 param=f"{where}[{i}].value")  # fmt: skip
    if len({(type(v), v) for v in values}) != len(values):
        raise InvalidRequest(f"'{where}': choice values must be distinct.", param=where)
    return tuple((json.dumps(v, ensure_ascii=False), _about(item, f"{where}[{i}]"))
                 for i, (v, item) in enumerate(zip(values, items, strict=True)))  # fmt: skip


def _levels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    items = _items(value, where, 2, 10, {"label", "description"})
    return tuple((_text(item, "label", SHORT_TEXT, f"{where}[{i}]", required=True), _about(item, f"{where}[{i}]"))
                 for i, item in enumerate(items))  # fmt: skip


def _items(value: Any, where: str, least: int, most: int, fields: set[str]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not least <= len(value) <= most:
        raise InvalidRequest(f"'{where}' must be an array of {least} to {most} objects.", param=where)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}[{i}]' must be an object, got {kind_of(item)}.", param=f"{where}[{i}]")
        _fields(item, frozenset(fields), f"{where}[{i}]")
    return value


def _about(item: dict[str, Any], where: str) -> str:
    """A description: "" when absent, a string when sent (null is refused)."""
    return _text(item, "description", SHORT_TEXT, where, required="description" in item)


def _input(value: Any) -> str:
    """adapters.input_text: a string as it is; messages' texts joined by a blank line, a message's parts by a line."""
    if isinstance(value, str):
        return _bounded(value, INPUT_TEXT, "input")
    if not isinstance(value, list) or len(value) > MAX_MESSAGES:
        raise InvalidRequest(f"'input' must be a string or an array of at most {MAX_MESSAGES} user messages.",
                             param="input")  # fmt: skip
    return "\n\n".join(_message(message, f"input[{i}]") for i, message in enumerate(value))


def _message(value: Any, where: str) -> str:
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{where}' must be a message object, got {kind_of(value)}.", param=where)
    content = value.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        raise InvalidRequest("Decisions supports text input only; images are not supported", param=where)
    _fields(value, frozenset({"role", "content", "type"}), where)
    if value.get("role") != "user":
        raise InvalidRequest(f"'{where}.role' must be 'user'.", param=f"{where}.role")
    if value.get("type", "message") != "message":
        raise InvalidRequest(f"'{where}.type' must be 'message'.", param=f"{where}.type")
    if isinstance(content, str):
        return _bounded(content, INPUT_TEXT, f"{where}.content")
    if not isinstance(content, list) or len(content) > MAX_PARTS:
        raise InvalidRequest(f"'{where}.content' must be a string or an array of at most {MAX_PARTS} input_text "
                             "parts.", param=f"{where}.content")  # fmt: skip
    return "\n".join(_part(part, f"{where}.content[{i}]") for i, part in enumerate(content))


def _part(value: Any, where: str) -> str:
    if not isinstance(value, dict) or value.get("type") != "input_text":
        raise InvalidRequest(f"'{where}' must be an object of type 'input_text'.", param=where)
    _fields(value, frozenset({"type", "text"}), where)
    return _text(value, "text", INPUT_TEXT, where, required=True)


def _text(body: dict[str, Any], key: str, longest: int, where: str, required: bool = False) -> str:
    """A strict string field (absent or null: "" unless required)."""
    value = body.get(key)
    name = f"{where}.{key}" if where and where != key else key
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string, got {kind_of(value)}.", param=name)
    return _bounded(value, longest, name)


def _bounded(value: str, longest: int, name: str) -> str:
    if len(value) > longest:
        raise InvalidRequest(f"'{name}' must hold at most {longest} characters.", param=name)
    return value


def _fields(body: dict[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(body.keys() - known)
    if unknown:
        name = f"{where}.{unknown[0]}" if where else unknown[0]
        raise InvalidRequest(f"'{name}': extra inputs are not permitted (vLLM's Decisions API forbids unknown "
                             "fields).", param=name)  # fmt: skip


def _cache_salt(value: Any) -> None:
    """generate/base/protocol.py validate_cache_salt, vLLM's words."""
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise InvalidRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(value) > CACHE_SALT_LONGEST or CACHE_SALT_FORBIDDEN & set(value):
        raise InvalidRequest("Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', "
                             "'\\\\', or NUL.", param="cache_salt")  # fmt: skip
