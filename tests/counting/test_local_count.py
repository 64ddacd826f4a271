"""Counting parity: the guard's count equals transformers' apply_chat_template(tokenize=True) exactly, and the
tokenizer's own count for completions, for a real tokenizer and one trained on the spot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import CountedUpstreamOnly, InvalidRequest
from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS
from tests.support.reference import reference_chat_count


def guard_chat_count(tok: ModelTokenizer, case: dict[str, Any], counter: TokenCounter | None = None) -> int:
    return asyncio.run(count_chat(tok, parse_chat(json.dumps({"model": "m", **case}).encode()), counter))


@pytest.mark.parametrize("name,case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_chat_count_matches_apply_chat_template(
    guard_tok: ModelTokenizer, reference: Any, name: str, case: Any
) -> None:
    assert guard_chat_count(guard_tok, case) == reference_chat_count(reference, case)


@pytest.mark.parametrize("name,prompt", COMPLETION_PROMPTS, ids=[c[0] for c in COMPLETION_PROMPTS])
def test_completion_count_matches_tokenizer(guard_tok: ModelTokenizer, reference: Any, name: str, prompt: str) -> None:
    expected = len(reference(prompt)["input_ids"])
    batch = parse_completion(json.dumps({"prompt": [prompt, prompt + "!"]}).encode())
    assert asyncio.run(count_completion(guard_tok, batch))[0] == expected
    ids = parse_completion(json.dumps({"prompt": [[5, 6, 7], [8]]}).encode())
    assert asyncio.run(count_completion(guard_tok, ids)) == [3, 1]


def test_add_special_tokens_is_honoured_for_chat(deepseek_dir: Path) -> None:
    tok = load_tokenizer(str(deepseek_dir))
    case = {"messages": [{"role": "user", "content": "hi"}]}
    plain = guard_chat_count(tok, case)
    ref = AutoTokenizer.from_pretrained(str(deepseek_dir))
    text = ref.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
    assert guard_chat_count(tok, {**case, "add_special_tokens": True}) == len(ref(text)["input_ids"])
    assert plain == len(ref(text, add_special_tokens=False)["input_ids"])


def test_list_content_is_joined_with_newlines_for_string_templates(deepseek_dir: Path) -> None:
    tok = load_tokenizer(str(deepseek_dir))
    parts = [{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"}]
    as_parts = guard_chat_count(tok, {"messages": [{"role": "user", "content": parts}]})
    as_text = guard_chat_count(tok, {"messages": [{"role": "user", "content": "alpha\nbeta"}]})
    assert as_parts == as_text


PHI_35 = (  # microsoft/Phi-3.5-mini-instruct's template, as llama.cpp's sources ship it
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def test_an_empty_text_part_is_dropped_before_the_parts_are_joined(deepseek_dir: Path, tmp_path: Path) -> None:
    # vLLM 0.31/0.32 (_parse_chat_message_content_parts): `if parse_res: content.append(parse_res)`, so for a template
    # that reads content as a string an empty text part leaves no "\n" behind; the others are joined.
    template = tmp_path / "phi.jinja"
    template.write_text(PHI_35)
    tok = load_tokenizer(str(deepseek_dir), chat_template=template)
    parts = ["", {"type": "text", "text": "Hi"}, {"type": "text", "text": ""}, "there", {"type": "text", "text": ""}]
    ref = AutoTokenizer.from_pretrained(str(deepseek_dir))
    text = ref.apply_chat_template([{"role": "user", "content": "Hi\nthere"}], chat_template=PHI_35, tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    expected = len(ref(text, add_special_tokens=False)["input_ids"])
    assert guard_chat_count(tok, {"messages": [{"role": "user", "content": parts}]}) == expected
    only_empty = guard_chat_count(tok, {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]})
    assert only_empty == guard_chat_count(tok, {"messages": [{"role": "user", "content": ""}]})


def test_an_empty_text_part_stays_a_part_for_templates_that_loop_over_parts(deepseek_dir: Path, tmp_path: Path) -> None:
    # wrap_dicts: the part parses to {"type": "text", "text": ""}, which is truthy, so the template still sees it
    template = tmp_path / "parts.jinja"
    template.write_text("{% for m in messages %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endfor %}")
    tok = load_tokenizer(str(deepseek_dir), chat_template=template)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""}]
    ref = AutoTokenizer.from_pretrained(str(deepseek_dir))
    assert guard_chat_count(tok, {"messages": [{"role": "user", "content": parts}]}) == len(
        ref("[a][]", add_special_tokens=False)["input_ids"]
    )


def test_chat_template_override_changes_the_count(deepseek_dir: Path, tmp_path: Path) -> None:
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    default = load_tokenizer(str(deepseek_dir))
    custom = load_tokenizer(str(deepseek_dir), chat_template=override)
    case = {"messages": [{"role": "user", "content": "Hello there"}]}
    ref = AutoTokenizer.from_pretrained(str(deepseek_dir))
    expected = len(ref("[user] Hello there\n", add_special_tokens=False)["input_ids"])
    assert guard_chat_count(custom, case) == expected != guard_chat_count(default, case)


def test_continue_final_message_with_the_default_generation_prompt_is_refused_by_the_template_path(
    deepseek_dir: Path,
) -> None:
    # vLLM's validator only refuses both flags when both were sent; transformers then refuses the default.
    tok = load_tokenizer(str(deepseek_dir))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    with pytest.raises(InvalidRequest, match="not compatible"):
        guard_chat_count(tok, {"messages": messages, "continue_final_message": True})


def test_image_parts_are_left_to_the_upstream_with_a_clear_message(deepseek_dir: Path) -> None:
    tok = load_tokenizer(str(deepseek_dir))
    parts = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    with pytest.raises(CountedUpstreamOnly, match="image_url part; its tokens depend on the model's processor"):
        guard_chat_count(tok, {"messages": [{"role": "user", "content": parts}]})
    with pytest.raises(InvalidRequest, match="not a text part"):
        guard_chat_count(tok, {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]})


PIECES = list("abc XYZ.,!?:;-_'\"\n\t  東京🎉é0123{}()<>/\\") + ["<｜User｜>", "<|im_end|>", "  ", "\n\n    "]
TEXT = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGE, min_size=1, max_size=6), gen=st.booleans())
def test_random_conversations_count_exactly(
    guard_tok: ModelTokenizer, guard_counter: TokenCounter, reference: Any, messages: Any, gen: bool
) -> None:
    case = {"messages": messages, "add_generation_prompt": gen}
    assert guard_chat_count(guard_tok, case, guard_counter) == reference_chat_count(reference, case)
