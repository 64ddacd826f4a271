"""Cutting at added tokens reproduces tokenizers' own cut (lstrip, rstrip, normalized, leftmost-longest), piece for
piece, and refuses what it cannot reproduce; either way the count stays exact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

from proxy.counting import segments
from proxy.counting.segments import segmenter_for
from proxy.counting.text_count import TokenCounter
from proxy.settings import CountingSettings

TOKENS = [
    AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
    AddedToken("[L]", lstrip=True, normalized=False),
    AddedToken("[R]", rstrip=True, normalized=True),
    AddedToken("<<", normalized=True),
    AddedToken("<<<x>", normalized=False),
    AddedToken("ab", normalized=True),
    AddedToken("Ünï", normalized=True),
]
SPECIALS = [AddedToken("<|sep|>", special=True), AddedToken("<|sep|>x", special=True, rstrip=True)]
PIECES = ["<mask>", "[L]", "[R]", "[r]", "<<", "<<<x>", "<<<", "ab", "abab", "Ünï", "ünï", "<|sep|>", "<|sep|>x",
          "<|im_end|>", "<|im_start|>", "word", "x", "é", "東京", "🎉", ".", "!", " ", "  ", "\n", "\n\n", "\t",
          "\u00a0", "\u2000", "\u3000", "\x85", "\x1c", "\r\n"]  # fmt: skip
TEXT = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


def with_tokens(base: Tokenizer, normalizer: normalizers.Normalizer | None = None) -> Tokenizer:
    backend = Tokenizer.from_str(base.to_str())
    backend.normalizer = normalizer
    backend.add_tokens(TOKENS)
    backend.add_special_tokens(SPECIALS)
    return backend


@pytest.fixture(scope="module")
def base(chatml_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(chatml_dir / "tokenizer.json"))


@pytest.fixture(scope="module", params=["plain", "lowercase", "nfkc"])
def flagged(base: Tokenizer, request: pytest.FixtureRequest) -> Tokenizer:
    normalizer = {"plain": None, "lowercase": normalizers.Lowercase(), "nfkc": normalizers.NFKC()}[request.param]
    return with_tokens(base, normalizer)


def assert_cut_like_tokenizers(backend: Tokenizer, text: str) -> None:
    """The pieces encode to exactly the tokens tokenizers makes of the text, once the added tokens cut out are taken
    out (with a normalizer, `normalized` added tokens are not cut: they stay in the pieces)."""
    cut = segmenter_for(backend).cut(text)
    decoder = backend.get_added_tokens_decoder()
    cut_ids = {i for i, t in decoder.items() if not (t.normalized and backend.normalizer is not None)}
    full = backend.encode(text, add_special_tokens=False).ids
    pieces = [i for piece in cut.texts for i in backend.encode(piece, add_special_tokens=False).ids]
    assert pieces == [i for i in full if i not in cut_ids]
    assert cut.added + len(pieces) == len(full)


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
def test_the_cut_matches_tokenizers_with_strip_and_normalized_flags(flagged: Tokenizer, text: str) -> None:
    assert segmenter_for(flagged).refusal is None
    assert_cut_like_tokenizers(flagged, text)


@settings(max_examples=200, deadline=None)
@given(text=TEXT, window=st.integers(1, 12))
def test_searching_a_window_at_a_time_cuts_as_one_search(flagged: Tokenizer, text: str, window: int) -> None:
    # Long texts are searched for added tokens a window at a time; windows of a few characters put a window's edge
    # inside or just before most added tokens: the cut must not change.
    segmenter = segmenter_for(flagged)
    whole = segmenter.cut(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segments, "SEARCH_WINDOW", window)
        assert segmenter.cut(text) == whole


@pytest.mark.parametrize("scheme", ["always", "never"])
def test_metaspace_that_treats_every_piece_alike_is_cut(base: Tokenizer, scheme: str) -> None:
    backend = with_tokens(base)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    assert segmenter_for(backend).refusal is None
    for text in ["Hello<mask> world", " [L]x", "a<|sep|>b c<<d", "  <|sep|>x  y"]:
        assert_cut_like_tokenizers(backend, text)


def refusing(base: Tokenizer, kind: str) -> Tokenizer:
    backend = with_tokens(base)
    if kind == "overlap":  # " <b>" can start inside the whitespace "<a>" strips: tokenizers overlaps the two
        backend.add_tokens([AddedToken("<a>", rstrip=True, normalized=False), AddedToken(" <b>", normalized=False)])
    elif kind == "single_word":
        backend.add_tokens([AddedToken("word", single_word=True, normalized=False)])
    elif kind == "metaspace_first":
        backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    else:
        backend.encode_special_tokens = True
    return backend


@pytest.mark.parametrize("kind", ["overlap", "single_word", "metaspace_first", "encode_special_tokens"])
def test_what_cannot_be_reproduced_is_counted_whole_and_exactly(base: Tokenizer, kind: str) -> None:
    backend = refusing(base, kind)
    segmenter = segmenter_for(backend)
    assert segmenter.refusal is not None
    texts = ["a word<mask> wordy<|sep|>word", "<|sep|>x  word.", "", "  [L] [R]  ", "x<a> <b>y <a>  <b> z"]
    assert all(segmenter.cut(t).texts == (t,) for t in texts)
    assert [count(backend, t) for t in texts] == [len(backend.encode(t, add_special_tokens=False)) for t in texts]


def count(backend: Tokenizer, text: str) -> int:
    counter = TokenCounter(backend, CountingSettings(split_min_chars=8), cores=2)
    (n,) = asyncio.run(counter.count([text], add_special_tokens=False))
    return n


def test_the_load_time_self_check_accepts_the_cut(flagged: Tokenizer) -> None:
    counter = TokenCounter(flagged, CountingSettings(), cores=2)
    assert counter.segmenter.refusal is None
    assert (counter.splitter is None) == (flagged.normalizer is not None)
