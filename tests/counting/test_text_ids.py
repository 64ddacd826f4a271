"""The cached token-id encoder against the tokenizer's own `encode(...).ids`, on every family of the zoo and on
random text full of added tokens: cold, warm, with a cache too small to hold much, and with special tokens added."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.counting import text_ids
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import load_tokenizer
from proxy.settings import CountingSettings
from tests.corpus import LONG_TEXT
from tests.support.zoo import FAMILIES, family_dir

WORDS = ["Hello", "world", "the", "x", "é", "naïve", "東京", "こんにちは", "🎉", "👍🏽", "1234", "3.14",
         "def f(a, b):", '{"k": [1, 2]}', "<|im_end|>", "<|im_start|>", "<|eot_id|>", "<start_of_turn>",
         "<|start_header_id|>", "[INST]", "<think>", "<|end|>"]  # fmt: skip
GLUE = [" ", "  ", "\n", "\n\n", "\t", "    ", "\n    ", ".", ",", "!", ":", "...", ". ", "\r\n", "\u00a0", "-"]
TEXT = st.lists(st.sampled_from(WORDS) | st.sampled_from(GLUE), max_size=60).map("".join)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _backend(family: str) -> Any:
    return load_tokenizer(str(family_dir(family))).backend


@pytest.fixture(scope="module", params=FAMILIES)
def backend(request: pytest.FixtureRequest) -> Any:
    return _backend(request.param)


def _ids(backend: Any, cache_mb: float = 8.0) -> Any:
    return TokenCounter(backend, CountingSettings()).token_ids(cache_mb)


def _expected(backend: Any, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    return [list(backend.encode(t, add_special_tokens=add_special_tokens).ids) for t in texts]


@PROPERTY
@given(texts=st.lists(TEXT, min_size=1, max_size=4), specials=st.booleans())
def test_ids_equal_the_tokenizers_own_cold_and_warm(backend: Any, texts: list[str], specials: bool) -> None:
    encoder = _ids(backend)
    expected = _expected(backend, texts, specials)
    assert asyncio.run(encoder.ids(texts, specials)) == expected
    assert asyncio.run(encoder.ids(texts, specials)) == expected  # now from the caches


@PROPERTY
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_a_cache_too_small_to_hold_much_changes_no_id(backend: Any, texts: list[str]) -> None:
    encoder = _ids(backend, cache_mb=0.0005)
    for _ in range(2):
        assert asyncio.run(encoder.ids(texts, False)) == _expected(backend, texts, False)


def test_a_long_document_and_a_conversation_growing_turn_by_turn(backend: Any) -> None:
    encoder = _ids(backend)
    end = max((t.content for t in backend.get_added_tokens_decoder().values() if t.special), key=len)
    turns = [f"user\n{LONG_TEXT[i * 500 : (i + 1) * 500]} turn {i}{end}\n" for i in range(20)]
    for n in range(1, len(turns) + 1, 4):
        text = "".join(turns[:n])
        assert asyncio.run(encoder.ids([text], False)) == _expected(backend, [text], False)
    document = LONG_TEXT * 40
    assert asyncio.run(encoder.ids([document], True)) == _expected(backend, [document], True)
    assert encoder.hits > 0  # the earlier turns came from the cache


def test_a_piece_too_long_for_words_is_encoded_in_parts_with_the_same_ids(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text_ids, "WORDS_MAX_CHARS", 1000)
    encoder = _ids(backend)
    document = LONG_TEXT * 120  # hundreds of thousands of characters: several parts, more than one batch
    assert encoder.splitter is None or len(encoder.splitter.split(document)) > text_ids.BATCH_PARTS
    assert asyncio.run(encoder.ids([document], False)) == _expected(backend, [document], False)
