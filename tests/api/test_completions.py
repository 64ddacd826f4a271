"""Reading a completions request: the prompt forms vLLM accepts, and clear 400s for the rest."""

from __future__ import annotations

import json

import pytest

from proxy.api.completions import parse_completion
from proxy.errors import InvalidRequest
from tests.support.torch_save import embeds


@pytest.mark.parametrize(
    "prompt,fragment",
    [(None, "must be a string"), (5, "must be a string"), ([], "at least one prompt"), ([[]], "at least one prompt"),
     (["a", [1]], "cannot be mixed"), ([1, "a"], "cannot be mixed"), ([-1], "cannot be mixed"), ([True], "mixed"),
     ([1, 2.0], "mixed"), ([1, None], "mixed"), ([[1, 2], [3, -4]], "mixed"), ([[1], [False]], "mixed"),
     ([[1], []], "mixed")],
)  # fmt: skip
def test_bad_completion_prompts(prompt: object, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_completion(json.dumps({"prompt": prompt}).encode())
    assert info.value.param == "prompt" and fragment in info.value.message


def test_prompt_forms() -> None:
    assert parse_completion(b'{"prompt": "a"}').prompts == ["a"]
    assert parse_completion(b'{"prompt": ["a", "b"]}').prompts == ["a", "b"]
    assert parse_completion(b'{"prompt": [1, 2]}').prompts == [[1, 2]]
    assert parse_completion(b'{"prompt": [[1], [2, 3]]}').prompts == [[1], [2, 3]]
    assert parse_completion(b'{"prompt": [0, 150000]}').prompts == [[0, 150000]]


def test_prompt_embeds_are_prompts_of_their_own() -> None:
    alone = parse_completion(json.dumps({"prompt_embeds": [embeds((4, 8)), embeds((1, 9, 8))], "n": 3}).encode())
    assert (alone.prompts, alone.embeds, alone.sequences) == ([], (4, 9), 6)
    both = parse_completion(json.dumps({"prompt": ["a", "b"], "prompt_embeds": embeds((4, 8))}).encode())
    assert (both.prompts, both.embeds, both.sequences) == (["a", "b"], (4,), 3)
    empty_text = parse_completion(json.dumps({"prompt": "", "prompt_embeds": embeds((4, 8))}).encode())
    assert empty_text.prompts == [""]  # vLLM runs "" as a prompt of its own beside the tensor
    with pytest.raises(InvalidRequest, match="must be a string"):
        parse_completion(json.dumps({"prompt_embeds": []}).encode())
