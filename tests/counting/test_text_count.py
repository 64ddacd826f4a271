"""The segment-cached counter against the exact reference, transformers' apply_chat_template(tokenize=True), over
random conversations for a real tokenizer and one trained on the spot: cold, warm, growing, and with a cache too
small to hold much."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, processors

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.bound import verbatim_texts
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.settings import CountingSettings
from tests.corpus import CHAT_CASES, LONG_TEXT, WEATHER_TOOL
from tests.support.reference import reference_chat_count

WORDS = ["Hello", "world", "the", "x", "é", "naïve", "東京", "こんにちは", "한국어", "🎉", "👍🏽", "🧑‍🤝‍🧑",
         "1234", "3.14", "def f(a, b):", "return a + b", '{"k": [1, 2]}',
         "<｜User｜>", "<|im_end|>", "<|im_start|>", "<think>"]  # fmt: skip
GLUE = [" ", "  ", "\n", "\n\n", "\t", "    ", "\n    ", "\n\n  ", ".", ",", "!", "?", ":", "...", ". ", ".\n\n",
        "\r\n", "\u00a0", "\u3000", "-", "(", ")"]  # fmt: skip
TEXT = st.lists(st.sampled_from(WORDS) | st.sampled_from(GLUE), max_size=50).map("".join)
LEAD = st.sampled_from(["", " ", "  ", "\n", "\t", "    ", "\n\n  "])
TAIL = st.sampled_from(["", ".", "!", ":", " ", "  ", "\n", "\n\n", ".\n", ". "])

SYSTEM = st.builds(lambda t, end: {"role": "system", "content": t + end}, TEXT, TAIL)
USER = st.builds(lambda lead, t: {"role": "user", "content": lead + t}, LEAD, TEXT)
ASSISTANT = st.builds(lambda lead, t: {"role": "assistant", "content": lead + t}, LEAD, TEXT)
TOOL_CALL = st.builds(
    lambda args, result: [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": args})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ],
    TEXT, TEXT,
)  # fmt: skip
TURNS = st.lists(USER.map(lambda m: [m]) | ASSISTANT.map(lambda m: [m]) | TOOL_CALL, min_size=1, max_size=6)
CONVERSATION = st.builds(
    lambda system, turns, gen, tools: {
        "messages": [m for m in [system] if m] + [m for turn in turns for m in turn],
        "add_generation_prompt": gen,
        **({"tools": [WEATHER_TOOL]} if tools else {}),
    },
    st.none() | SYSTEM, TURNS, st.booleans(), st.booleans(),
)  # fmt: skip
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def eager_counter(tok: ModelTokenizer, cache_mb: float = 64.0) -> TokenCounter:
    """Splits every uncached piece of 64+ characters four ways, so the parallel path runs on small texts too."""
    return TokenCounter(tok.backend, CountingSettings(cache_mb=cache_mb, split_min_chars=64), cores=4)


@pytest.fixture(scope="session")
def eager(guard_tok: ModelTokenizer) -> TokenCounter:
    """Built once: each example takes `eager.fresh()`, empty caches with the same load-time checks."""
    return eager_counter(guard_tok)


@pytest.fixture(scope="session")
def eager_tiny(guard_tok: ModelTokenizer) -> TokenCounter:
    return eager_counter(guard_tok, cache_mb=0.002)  # about 2 KB: a handful of short pieces


@pytest.fixture(scope="session")
def small_words(guard_tok: ModelTokenizer) -> TokenCounter:
    return TokenCounter(guard_tok.backend, CountingSettings(word_cache_mb=0.01), cores=4)


@pytest.fixture(scope="session")
def four_cores(guard_tok: ModelTokenizer) -> TokenCounter:
    return TokenCounter(guard_tok.backend, CountingSettings(), cores=4)


def guard_count(tok: ModelTokenizer, counter: TokenCounter, case: dict[str, Any]) -> int:
    request = parse_chat(json.dumps({"model": "m", **case}).encode())
    return asyncio.run(count_chat(tok, request, counter))


def test_the_engine_is_on_for_both_tokenizers(guard_tok: ModelTokenizer) -> None:
    counter = eager_counter(guard_tok)
    assert counter.segmenter.refusal is None and counter.splitter is not None and counter.specials == 0


@pytest.mark.parametrize("name,case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_corpus_counts_exactly(guard_tok: ModelTokenizer, reference: Any, name: str, case: Any) -> None:
    counter = eager_counter(guard_tok)
    assert guard_count(guard_tok, counter, case) == reference_chat_count(reference, case)


@PROPERTY
@given(case=CONVERSATION)
def test_cold_and_warm_counts_equal_the_reference(
    guard_tok: ModelTokenizer, eager: TokenCounter, reference: Any, case: Any
) -> None:
    expected = reference_chat_count(reference, case)
    counter = eager.fresh()
    assert guard_count(guard_tok, counter, case) == expected
    misses = counter.stats().misses
    assert guard_count(guard_tok, counter, case) == expected
    assert counter.stats().misses == misses  # the second time every piece came from the cache


@PROPERTY
@given(system=st.none() | SYSTEM, turns=TURNS)
def test_a_growing_conversation_counts_exactly_turn_by_turn(
    guard_tok: ModelTokenizer, eager: TokenCounter, reference: Any, system: Any, turns: list[list[dict[str, Any]]]
) -> None:
    counter = eager.fresh()
    messages = [system] if system else []
    for turn in turns:
        messages += turn
        case = {"messages": messages, "add_generation_prompt": True}
        assert guard_count(guard_tok, counter, case) == reference_chat_count(reference, case)


@PROPERTY
@given(cases=st.lists(CONVERSATION, min_size=1, max_size=5))
def test_a_tiny_cache_stays_within_its_bound(
    guard_tok: ModelTokenizer, eager_tiny: TokenCounter, reference: Any, cases: Any
) -> None:
    counter = eager_tiny.fresh()
    for case in cases + cases:
        assert guard_count(guard_tok, counter, case) == reference_chat_count(reference, case)
        stats = counter.stats()
        assert stats.bytes <= stats.max_bytes == int(0.002 * 2**20)


def test_a_zero_cache_keeps_nothing_and_stays_exact(guard_tok: ModelTokenizer, reference: Any) -> None:
    counter = eager_counter(guard_tok, cache_mb=0)
    case = {"messages": [{"role": "user", "content": LONG_TEXT}]}
    assert guard_count(guard_tok, counter, case) == guard_count(guard_tok, counter, case)
    assert guard_count(guard_tok, counter, case) == reference_chat_count(reference, case)
    assert counter.stats().entries == 0 and counter.stats().hits == 0


def test_stats_count_hits_misses_entries_and_bytes(guard_tok: ModelTokenizer) -> None:
    counter = eager_counter(guard_tok)
    case = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": LONG_TEXT}]}
    guard_count(guard_tok, counter, case)
    cold = counter.stats()
    guard_count(guard_tok, counter, case)
    warm = counter.stats()
    assert cold.hits == 0 and cold.misses == cold.entries > 0 and cold.bytes > len(LONG_TEXT)
    assert warm.hits == cold.misses and warm.misses == cold.misses and warm.entries == cold.entries


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_completion_batches_count_exactly(guard_tok: ModelTokenizer, add_special_tokens: bool) -> None:
    prompts = [LONG_TEXT, "Hello <|im_end|> there", "", "  indented\n\n    code", LONG_TEXT]
    request = parse_completion(json.dumps({"prompt": prompts, "add_special_tokens": add_special_tokens}).encode())
    counts = asyncio.run(count_completion(guard_tok, request, eager_counter(guard_tok)))
    assert counts == [len(guard_tok.backend.encode(p, add_special_tokens=add_special_tokens)) for p in prompts]


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_post_processor_tokens_are_added_once_per_text(chatml_dir: Path, add_special_tokens: bool) -> None:
    backend = Tokenizer.from_file(str(chatml_dir / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|im_end|>", special_tokens=[("<|endoftext|>", 0), ("<|im_end|>", 2)]
    )
    counter = TokenCounter(backend, CountingSettings(split_min_chars=64), cores=4)
    texts = ["", "hi", "<|im_start|>user\nHello there, how are you?<|im_end|>\n" * 5, LONG_TEXT]
    expected = [len(backend.encode(t, add_special_tokens=add_special_tokens)) for t in texts]
    assert counter.specials == 2
    assert asyncio.run(counter.count(texts, add_special_tokens)) == expected


SYNC_ENCODERS = ("encode", "encode_batch", "encode_batch_fast")
ENCODERS = {*SYNC_ENCODERS, *(f"async_{name}" for name in SYNC_ENCODERS)}


class Recorder:
    """A backend stand-in that records which encoding methods a count calls."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._backend, name)
        if name not in ENCODERS:
            return method

        def record(texts: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, len(texts) if isinstance(texts, list) else 1))
            return method(texts, *args, **kwargs)

        return record


def test_everything_uncached_goes_in_one_gil_releasing_batch(guard_tok: ModelTokenizer) -> None:
    recorder = Recorder(guard_tok.backend)
    counter = TokenCounter(recorder, CountingSettings(split_min_chars=64), cores=4)
    recorder.calls.clear()  # the load-time self-check encodes too
    texts = [LONG_TEXT, "<|im_start|>user\nHi<|im_end|>\n<｜User｜>Hi again", "short"]
    asyncio.run(counter.count(texts, add_special_tokens=False))
    assert [name for name, _ in recorder.calls] == ["encode_batch_fast"]
    assert recorder.calls[0][1] > len(texts)  # pieces and split parts, all in the one call
    asyncio.run(counter.count(texts, add_special_tokens=False))
    assert len(recorder.calls) == 1  # all cached: no encoding at all


def test_fresh_text_of_familiar_words_is_counted_from_the_word_cache(guard_tok: ModelTokenizer) -> None:
    recorder = Recorder(guard_tok.backend)
    counter = TokenCounter(recorder, CountingSettings(), cores=4)
    assert counter.by_words
    known = "the river bends east past the old mill and the quiet town"
    asyncio.run(counter.count([known], add_special_tokens=False))
    recorder.calls.clear()
    fresh = "the quiet mill bends past the river and the old town east"  # a new segment, no new word
    (n,) = asyncio.run(counter.count([fresh], add_special_tokens=False))
    assert n == len(guard_tok.backend.encode(fresh, add_special_tokens=False))
    assert recorder.calls == []  # counted without encoding anything
    novel = fresh + " zebra"
    assert asyncio.run(counter.count([novel], add_special_tokens=False)) == [
        len(guard_tok.backend.encode(novel, add_special_tokens=False))
    ]
    assert recorder.calls == [("encode_batch_fast", 1)]  # only the new word


@PROPERTY
@given(texts=st.lists(TEXT, min_size=1, max_size=8))
def test_word_by_word_counts_stay_exact(guard_tok: ModelTokenizer, small_words: TokenCounter, texts: list[str]) -> None:
    counter = small_words.fresh()
    for _ in range(2):  # cold, then warm (and a word cache small enough to evict)
        counts = asyncio.run(counter.count(texts, add_special_tokens=False))
        assert counts == [len(guard_tok.backend.encode(t, add_special_tokens=False)) for t in texts]


@PROPERTY
@given(text=TEXT, lead=LEAD)
def test_the_size_floor_never_exceeds_the_real_count(four_cores: TokenCounter, reference: Any, text: str,
                                                       lead: str) -> None:  # fmt: skip
    counter = four_cores.fresh()
    case = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": lead + text}]}
    floor = counter.floor(list(verbatim_texts(case["messages"])), ceiling=0)
    assert floor is None or floor <= reference_chat_count(reference, case)


@PROPERTY
@given(text=TEXT, lead=LEAD, tail=TAIL, copies=st.integers(2, 40))
def test_counting_until_proven_never_exceeds_the_real_count(eager: TokenCounter, reference: Any, text: str, lead: str,
                                                            tail: str, copies: int) -> None:  # fmt: skip
    # Split four ways from 64 characters on, so that texts this short have interior parts; a ceiling of 0 makes any
    # interior count the answer: it must stay below the count of a prompt that holds the texts.
    counter = eager.fresh()
    system = "Be brief." + tail
    case = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": lead + text * copies}]}
    proven = asyncio.run(counter.at_least(list(verbatim_texts(case["messages"])), ceiling=0))
    assert proven is None or proven <= reference_chat_count(reference, case)


def test_a_huge_prompt_is_proven_too_long_by_counting_only_its_start(guard_tok: ModelTokenizer) -> None:
    recorder = Recorder(guard_tok.backend)
    counter = TokenCounter(recorder, CountingSettings(), cores=2)
    recorder.calls.clear()
    huge = LONG_TEXT * 20_000  # about 50 MB
    proven = asyncio.run(counter.at_least([huge], ceiling=2048))
    assert proven is not None and 2048 < proven <= len(guard_tok.backend.encode(huge[:1_000_000]).ids)
    assert sum(n for _, n in recorder.calls) <= 8  # a few slices encoded, not the 460 of the whole text
    short = LONG_TEXT * 2  # shorter than the ceiling's worth of tokens: nothing is proven
    assert asyncio.run(counter.at_least([short], ceiling=2048)) is None


def test_a_huge_prompt_is_proven_too_long_from_its_size(guard_tok: ModelTokenizer) -> None:
    counter = TokenCounter(guard_tok.backend, CountingSettings(), cores=4)
    assert counter.max_token_bytes is not None and counter.max_token_bytes < 1024
    huge = LONG_TEXT * 2000  # about 3 MB
    floor = counter.floor([huge], ceiling=2048)
    assert floor is not None and 2048 < floor <= len(guard_tok.backend.encode(huge[:1_000_000]).ids) * 3
    assert counter.floor(["short"], ceiling=2048) is None  # fewer characters than the ceiling prove nothing


def test_a_long_text_is_encoded_in_bounded_batches_and_kept_only_as_a_digest(guard_tok: ModelTokenizer) -> None:
    recorder = Recorder(guard_tok.backend)
    counter = TokenCounter(recorder, CountingSettings(), cores=2)
    recorder.calls.clear()
    long_text = LONG_TEXT * 400  # about 600,000 characters: more than two batches
    (count,) = asyncio.run(counter.count([long_text], add_special_tokens=False))
    assert count == len(guard_tok.backend.encode(long_text, add_special_tokens=False))
    assert len(recorder.calls) >= 3 and all(name == "encode_batch_fast" for name, _ in recorder.calls)
    assert counter.stats().bytes < 10_000  # the 600 KB text is remembered under its digest
    recorder.calls.clear()
    assert asyncio.run(counter.count([long_text], add_special_tokens=False)) == [count]
    assert recorder.calls == []  # found again by its digest


def test_a_fresh_counter_starts_empty_and_counts_as_its_origin(guard_tok: ModelTokenizer) -> None:
    origin = eager_counter(guard_tok)
    case = {"messages": [{"role": "user", "content": LONG_TEXT}]}
    expected = guard_count(guard_tok, origin, case)
    fresh = origin.fresh()
    assert fresh.stats().entries == fresh.stats().hits == fresh.stats().misses == 0  # nothing carried over
    assert guard_count(guard_tok, fresh, case) == expected
    assert fresh.stats().hits == 0 and fresh.stats().misses > 0  # counted afresh, not from the origin's cache
    assert origin.stats().max_bytes == fresh.stats().max_bytes
