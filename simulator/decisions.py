"""POST /v1/decisions, as vLLM 0.33 / 0.34 answer it for a next-token model (`openai/decisions/`: protocol.py,
adapters.py, question_types.py, strategies.py NextTokenStrategy): every object forbids unknown fields; each question
is one engine request, its prompt the input's text, a blank line and the question with its lettered options as one
chat user turn (thinking off, the generation prompt), and one token generated. The answer's usage is in Responses'
names, summed over the questions. The simulator's own reading, apart from the guard's."""

from __future__ import annotations

import json
from typing import Any, NoReturn

from simulator.chat_prompt import ChatOptions, render_chat
from simulator.context import Context
from simulator.errors import ApiError, request_validation_error
from simulator.limits import OutputRequest, PromptShape, check_prompt_text, check_prompt_tokens
from simulator.token_in import DECODER

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
ALLOWED = {
    "request": {"model", "input", "questions", "safety_identifier", "joint", "cache_salt"},
    "predicate": {"type", "instructions", "name"},
    "choice": {"type", "instructions", "name", "choices"},
    "score": {"type", "instructions", "name", "levels"},
    "message": {"role", "content", "type"},
}


def decide(ctx: Context, body: Any, headers: dict[str, str]) -> dict[str, Any]:
    questions = _read(body)
    ctx.check_model(body["model"])
    if len(questions) > 64:
        raise ApiError("questions: at most 64 for this model")
    if any(len(options) > len(LETTERS) for _, options in questions):
        raise ApiError(f"This model supports at most {len(LETTERS)} choices per question")
    if body.get("joint"):
        raise ApiError("joint: this model reads each question on its own; joint reads need DiffusionGemma")
    state = _state(body["input"])
    prompts = [_render(ctx, f"{state}\n\n{_question(q)}") for q in questions]
    for ids in prompts:  # the engine's check, once every prompt is rendered
        if len(ids) >= ctx.settings.max_model_len:
            raise ApiError(f"{DECODER.format(n=len(ids))} plus the number of requested output tokens (at least 1) is "
                           f"longer than the maximum model length of {ctx.settings.max_model_len}. Make sure that "
                           "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
                           "tokens).")  # fmt: skip
    used = sum(len(ids) for ids in prompts)
    usage = {"input_tokens": used, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens": len(prompts), "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": used + len(prompts)}  # fmt: skip
    answers = [_answer(raw) for raw in body["questions"]]
    return {"model": ctx.settings.model, "answers": answers, "usage": usage}  # the served name (no LoRA here)


def _read(body: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """(instructions, options) per question, or pydantic's 400 for the first field it refuses."""
    if not isinstance(body, dict):
        raise request_validation_error(["Input should be a valid dictionary"], param="body")
    _only(body, "request", "body")
    if not isinstance(body.get("model"), str):
        _refuse("body.model", "Input should be a valid string")
    questions = body.get("questions")
    if not isinstance(questions, list) or not 1 <= len(questions) <= 200:
        _refuse("body.questions", "List should have between 1 and 200 items")
    read = [_options(q, f"body.questions.{i}") for i, q in enumerate(questions)]
    _state(body.get("input"))
    if not isinstance(body.get("joint", False), bool):
        _refuse("body.joint", "Input should be a valid boolean")
    return read


def _options(question: Any, loc: str) -> tuple[str, list[tuple[str, str]]]:
    kind = question.get("type") if isinstance(question, dict) else None
    if kind not in ("predicate", "choice", "score"):
        _refuse(loc, "Input tag does not match any of the expected tags: 'predicate', 'choice', 'score'")
    _only(question, kind, loc)
    if not isinstance(question.get("instructions"), str):
        _refuse(f"{loc}.instructions", "Input should be a valid string")
    if "name" in question and not isinstance(question["name"], str):
        _refuse(f"{loc}.name", "Value error, name must be a string when provided")
    if kind == "predicate":
        return question["instructions"], [("false", ""), ("true", "")]
    listed = question.get("choices" if kind == "choice" else "levels")
    least, most = (2, 255) if kind == "choice" else (2, 10)
    if not isinstance(listed, list) or not least <= len(listed) <= most:
        _refuse(f"{loc}.{kind}", f"List should have between {least} and {most} items")
    options = []
    for item in listed:
        if not isinstance(item, dict) or set(item) - {"value" if kind == "choice" else "label", "description"}:
            _refuse(f"{loc}.{kind}", "Input should be an object without extra inputs")
        name = item.get("value") if kind == "choice" else item.get("label")
        about = item.get("description", "")
        if not isinstance(name, str if kind == "score" else str | bool) or not isinstance(about, str):
            _refuse(f"{loc}.{kind}", "Input should be a valid string")
        options.append((name if isinstance(name, str) and kind == "score" else json.dumps(name, ensure_ascii=False),
                        about))  # fmt: skip
    if kind == "choice" and len({(type(c["value"]), c["value"]) for c in listed}) != len(listed):
        _refuse(loc, "Value error, choice values must be distinct")
    return question["instructions"], options


def _only(fields: dict[str, Any], kind: str, loc: str) -> None:
    for name in fields:
        if name not in ALLOWED[kind]:
            _refuse(f"{loc}.{name}", "Extra inputs are not permitted")


def _state(value: Any) -> str:
    """adapters.input_text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        _refuse("body.input", "Input should be a valid string")
    texts = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") != "user":
            _refuse(f"body.input.{i}", "Input should be a user message")
        _only(message, "message", f"body.input.{i}")
        content = message.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "input_text" or set(p) != {"type", "text"}
                   or not isinstance(p.get("text"), str) for p in content):  # fmt: skip
                _refuse(f"body.input.{i}.content", "Input should be input_text parts")
            content = "\n".join(p["text"] for p in content)
        if not isinstance(content, str):
            _refuse(f"body.input.{i}.content", "Input should be a valid string")
        texts.append(content)
    return "\n\n".join(texts)


def _question(question: tuple[str, list[tuple[str, str]]]) -> str:
    """question_types.QuestionType.prompt."""
    instructions, options = question
    lines = [f"{letter}: {name} - {about}" if about else f"{letter}: {name}"
             for letter, (name, about) in zip(LETTERS, options, strict=False)]  # fmt: skip
    lines.append("Answer with the letter of one option only.")
    text = "\n".join(lines)
    return f"Question: {instructions}\n{text}" if instructions else text


def _render(ctx: Context, content: str) -> list[int]:
    """The renderer's checks on one question's prompt: the window in characters, then in tokens."""
    options = ChatOptions([{"role": "user", "content": content}], template_kwargs={"enable_thinking": False})
    chat = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header)
    window = OutputRequest(ctx.settings.max_model_len, 1)
    shape = PromptShape(len(chat.token_ids), len(chat.text), ctx.tokenizer.max_chars_per_token)
    error = check_prompt_text(ctx.profile, window, shape) or check_prompt_tokens(ctx.profile, window, shape.tokens)
    if error is not None:
        raise error
    return chat.token_ids


def _answer(question: dict[str, Any]) -> dict[str, Any]:
    """An answer of vLLM's shape; the fake model reads every option as equally likely."""
    kind, name = question["type"], question.get("name")
    if kind == "predicate":
        return {"type": kind, "name": name, "probability": 0.5}
    listed = question["choices" if kind == "choice" else "levels"]
    even = 1.0 / len(listed)
    if kind == "choice":
        probabilities = [{"value": c["value"], "probability": even} for c in listed]
        return {"type": kind, "name": name, "choice": listed[0]["value"], "probabilities": probabilities,
                "confidence": even}  # fmt: skip
    levels = [{"value": i, "label": level["label"], "probability": even} for i, level in enumerate(listed)]
    score = sum(i * even for i in range(len(listed)))
    return {"type": kind, "name": name, "score": score, "probabilities": levels, "confidence": even}


def _refuse(loc: str, msg: str) -> NoReturn:
    raise request_validation_error([str({"type": "value_error", "loc": loc, "msg": msg})], param=loc)
