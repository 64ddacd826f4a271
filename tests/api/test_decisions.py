"""The Decisions wire model (vLLM 0.33's DecisionRequest): each question written out as the user turn vLLM renders
for it, and every field checked as vLLM's request model checks it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.decisions import check_serving, decision_request
from proxy.errors import InvalidRequest

PREDICATE = {"type": "predicate", "instructions": "Is it late?"}
PARTS = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]


def test_each_question_is_the_input_then_its_lettered_options() -> None:
    req = decision_request({
        "model": "m",
        "input": [{"role": "user", "content": "Hello"}, {"role": "user", "type": "message", "content": PARTS}],
        "questions": [
            {**PREDICATE, "name": "late"},
            {"type": "choice", "instructions": "Which?", "choices": [
                {"value": "Ünï", "description": "the first"}, {"value": True}, {"value": "true", "description": ""}]},
            {"type": "score", "instructions": "", "levels": [{"label": "low"}, {"label": "high", "description": "!"}]},
        ],
    })  # fmt: skip
    assert list(req.prompts()) == [
        "Hello\n\na\nb\n\nQuestion: Is it late?\nA: false\nB: true\nAnswer with the letter of one option only.",
        'Hello\n\na\nb\n\nQuestion: Which?\nA: "Ünï" - the first\nB: true\nC: "true"\n'
        "Answer with the letter of one option only.",
        "Hello\n\na\nb\n\nA: low\nB: high - !\nAnswer with the letter of one option only.",
    ]  # the input's messages joined by a blank line, a message's parts by a line; a choice's value as JSON


@pytest.mark.parametrize(
    "body,param",
    [({"input": "x", "questions": [PREDICATE]}, "model"),
     ({"model": 1, "input": "x", "questions": [PREDICATE]}, "model"),
     ({"model": "m", "questions": [PREDICATE]}, "input"),
     ({"model": "m", "input": "x", "questions": [PREDICATE], "max_tokens": 5}, "max_tokens"),
     ({"model": "m", "input": "x", "questions": [{**PREDICATE, "type": "ranking"}]}, "questions[0].type"),
     ({"model": "m", "input": "x", "questions": [{"type": "predicate"}]}, "questions[0].instructions"),
     ({"model": "m", "input": "x", "questions": [{**PREDICATE, "name": None}]}, "questions[0].name"),
     ({"model": "m", "input": "x", "questions": [{**PREDICATE, "choices": []}]}, "questions[0].choices"),
     ({"model": "m", "input": "x", "questions": [{"type": "score", "instructions": "", "levels": [{"label": "a"}] * 11
                                                  }]}, "questions[0].levels"),
     ({"model": "m", "input": "x", "questions": [{"type": "score", "instructions": "",
                                                  "levels": [{"label": "a"}, {"label": "b", "description": None}]}]},
      "questions[0].levels[1].description"),
     ({"model": "m", "input": [{"role": "user", "content": "x", "name": "n"}], "questions": [PREDICATE]},
      "input[0].name"),
     ({"model": "m", "input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "questions": [PREDICATE]},
      "input[0].content[0]"),
     ({"model": "m", "input": "x", "questions": [PREDICATE], "joint": "yes"}, "joint"),
     ({"model": "m", "input": "x", "questions": [PREDICATE], "safety_identifier": "s" * 129}, "safety_identifier"),
     ({"model": "m", "input": "x", "questions": [PREDICATE], "cache_salt": ""}, "cache_salt"),
     ({"model": "m", "input": "x", "questions": [PREDICATE], "cache_salt": "a/b"}, "cache_salt")],
)  # fmt: skip
def test_what_vllms_model_refuses_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decision_request(body)
    assert caught.value.param == param


def test_the_serving_layers_limits_come_after_the_model() -> None:
    many = decision_request({"model": "m", "input": "x", "questions": [PREDICATE] * 65})  # the model takes 200
    with pytest.raises(InvalidRequest, match="questions: at most 64 for this model"):
        check_serving(many)
    check_serving(decision_request({"model": "m", "input": "x", "questions": [PREDICATE] * 64}))
