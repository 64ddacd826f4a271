"""Splitting long pieces for parallel counting: the rule refuses the cuts known to change a count, and every cut it
accepts keeps the count exact (tested here directly, without the load-time self-check that would hide a bad rule)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

from proxy.counting.selfcheck import words_agree
from proxy.counting.splitting import Splitter, is_candidate, is_safe_cut, splitter_for, window_agrees, words
from tests.corpus import LONG_TEXT


@pytest.fixture(scope="module")
def deepseek(deepseek_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(deepseek_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def gpt2(chatml_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(chatml_dir / "tokenizer.json"))


def count(backend: Tokenizer, *texts: str) -> int:
    return sum(len(backend.encode(t, add_special_tokens=False)) for t in texts)


def test_before_a_newline_after_punctuation_is_refused_for_the_deepseek_regex(deepseek: Tokenizer) -> None:
    text = "It ends here.\nNext line starts. And goes on."
    i = text.index("\n")
    assert count(deepseek, text[:i], text[i:]) != count(deepseek, text)  # the cut really is bad
    assert not is_candidate(text, i)
    assert not window_agrees(text, i, deepseek.pre_tokenizer.pre_tokenize_str)


def test_after_a_blank_line_before_indentation_is_refused_for_the_gpt2_regex(gpt2: Tokenizer) -> None:
    text = "def f():\n    pass\n\n    return 1 and more words"
    i = text.index("\n\n") + 2
    assert count(gpt2, text[:i], text[i:]) != count(gpt2, text)  # the cut really is bad
    assert not is_candidate(text, i)  # a space after whitespace
    assert not window_agrees(text, i, gpt2.pre_tokenizer.pre_tokenize_str)


def test_the_rule_takes_a_space_after_a_word(deepseek: Tokenizer, gpt2: Tokenizer) -> None:
    text = "one two three four"
    i = text.index(" two")
    assert is_safe_cut(text, i, deepseek.pre_tokenizer.pre_tokenize_str)
    assert is_safe_cut(text, i, gpt2.pre_tokenizer.pre_tokenize_str)


PIECES = ["word", "x", "é", "東京", "こんにちは", "🎉", "👍🏽", "12345", "3.14", "def", "(a, b):", '{"k": 1}',
          " ", "  ", "    ", "\n", "\n\n", "\t", ".", "!", "?", ":", ";", "...", "'s", "-", "\u00a0", "\u3000",
          "\r\n"]  # fmt: skip
TEXT = st.lists(st.sampled_from(PIECES), min_size=1, max_size=120).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_every_accepted_cut_keeps_the_count(deepseek: Tokenizer, gpt2: Tokenizer, text: str) -> None:
    for backend in (deepseek, gpt2):
        whole = count(backend, text)
        pre_tokenize = backend.pre_tokenizer.pre_tokenize_str
        for i in range(1, len(text)):
            if is_safe_cut(text, i, pre_tokenize):
                assert count(backend, text[:i], text[i:]) == whole, (text[:i], text[i:])


@settings(max_examples=60, deadline=None)
@given(text=TEXT, parts=st.integers(2, 8))
def test_split_parts_join_back_and_count_the_same(deepseek: Tokenizer, gpt2: Tokenizer, text: str, parts: int) -> None:
    for backend in (deepseek, gpt2):
        splitter = splitter_for(backend, parts, min_chars=0)
        assert splitter is not None
        pieces = splitter.split(text)
        assert "".join(pieces) == text and len(pieces) <= parts and all(pieces)
        assert count(backend, *pieces) == count(backend, text)


MORE = ["don't", "I'M", "x=>y", "#", "`q`", "\u200b", "١٢٣", "ﬁ", "\x0b", "\x00", "\u3000 "]
WORDY = st.lists(st.sampled_from(PIECES + MORE), min_size=1, max_size=200).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=WORDY)
def test_all_word_cuts_at_once_keep_the_count(deepseek: Tokenizer, gpt2: Tokenizer, text: str) -> None:
    pieces = words(text)
    assert "".join(pieces) == text and all(pieces)
    assert all(p.startswith(" ") for p in pieces[1:]) and all(not p[-1].isspace() for p in pieces[:-1])
    cuts = [i for i in range(len(text)) if is_candidate(text, i)]  # every candidate is a cut: none is missed
    assert pieces == [text[a:b] for a, b in pairwise([0, *cuts, len(text)])]
    for backend in (deepseek, gpt2):
        assert count(backend, *pieces) == count(backend, text), pieces


def test_the_word_self_check_passes_for_regex_tokenizers_and_catches_a_lying_rule(gpt2: Tokenizer) -> None:
    assert words_agree(gpt2)
    pairs = Tokenizer.from_str(gpt2.to_str())  # pre-tokens span a space after a word: the rule does not hold
    pairs.pre_tokenizer = pre_tokenizers.Split(Regex(r"\S+ +\S+"), behavior="isolated")
    text = "d\n e \u00a0f"
    assert count(pairs, *words(text)) != count(pairs, text)
    assert not words_agree(pairs)


def test_long_text_splits_into_one_part_per_core(deepseek: Tokenizer) -> None:
    text = LONG_TEXT * 10
    pieces = Splitter(deepseek.pre_tokenizer.pre_tokenize_str, parts=4, min_chars=1000).split(text)
    assert len(pieces) == 4 and "".join(pieces) == text
    assert count(deepseek, *pieces) == count(deepseek, text)
    assert Splitter(deepseek.pre_tokenizer.pre_tokenize_str, parts=4, min_chars=len(text) + 1).split(text) == [text]


def test_no_split_with_a_normalizer_or_metaspace(gpt2: Tokenizer) -> None:
    normalized = Tokenizer.from_str(gpt2.to_str())
    normalized.normalizer = normalizers.NFC()
    metaspace = Tokenizer.from_str(gpt2.to_str())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    bare = Tokenizer.from_str(gpt2.to_str())
    bare.pre_tokenizer = None
    assert splitter_for(normalized, 4, 0) is None
    assert splitter_for(metaspace, 4, 0) is None
    assert splitter_for(bare, 4, 0) is None
    assert splitter_for(gpt2, 4, 0) is not None
