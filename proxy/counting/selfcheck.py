"""Confirm at load, on probe texts built from a tokenizer's own added tokens, that the counting shortcuts (cutting at
added tokens, splitting long pieces, counting word by word) give exactly the tokenizer's counts, and its token ids.
A shortcut that misses once is switched off for that model: correctness before speed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.counting.segments import Segmenter
from proxy.counting.splitting import Splitter, words

PROBED_TOKENS = 48
SAMPLE = (
    "The quick brown fox, said she.\n\n  Indented line\n\tTabbed: yes!\n"
    "def add(a, b):\n    return a + b  # sum\n\n\n"
    '{"city": "Paris", "temp": 21.5, "tags": ["a", "b"]}\n'
    "東京は日本の首都です。 今日は 良い天気 ですね。\n"
    "Emoji run: 🎉🚀 👍🏽 🧑‍🤝‍🧑 done...   trailing   \n"
    "x.\n\n    y; z?\r\n  - item one\n  - item two 1234567 3.14159 "
)


SPLIT_TEXTS = (SAMPLE * 6, (SAMPLE * 6)[37:])


def probe_texts(contents: list[str]) -> list[str]:
    """Added tokens against every kind of neighbour: words, punctuation, spaces and newlines on either side."""
    flagged = contents[:PROBED_TOKENS] or ["<none>"]
    probes = ["", " ", "\n\n", SAMPLE]
    for i, c in enumerate(flagged):
        other = flagged[(i + 1) % len(flagged)]
        probes += [
            f"a{c}b",
            f"Hi. {c}  x ",
            f"\n\n  {c}\n\n  y",
            f"{c}{c} {other}",
            f"é{c}東京 {other[:-1]}",
            f"  {c}",
            f"{c}  ",
        ]
    return probes


def segments_agree(backend: Any, segmenter: Segmenter) -> bool:
    texts = probe_texts(probed_contents(backend))
    cuts = [segmenter.cut(t) for t in texts]
    lengths = iter(_lengths(backend, [s for c in cuts for s in c.texts]))
    fast = [c.added + sum(next(lengths) for _ in c.texts) for c in cuts]
    return fast == _lengths(backend, texts)


def splits_agree(backend: Any, splitter: Splitter) -> bool:
    eager = _eager(splitter)
    return [sum(_lengths(backend, eager.split(t))) for t in SPLIT_TEXTS] == _lengths(backend, list(SPLIT_TEXTS))


TRICKY = (
    "a  b\tc \td\n e \u00a0f\u3000g  \n\n h's don't I'M 12345 6.5e-3 x=>y //c #h {k: 'v'} "
    "東京 タワー 。 、 ! ? ... 😀 👍🏽 🧑‍🤝‍🧑 é ß Ω İ ﬁ Ⅻ ١٢٣ अ ก \u200b `q` $x -y _z \x0b\x1c end  "
)
WORD_TEXTS = (SAMPLE, SAMPLE * 3, TRICKY, TRICKY[::-1], TRICKY + SAMPLE, " " + TRICKY, TRICKY.replace(" ", "  "))


def words_agree(backend: Any) -> bool:
    """Every text of a varied sample counts the same whole and as the sum of its word pieces (all cuts at once)."""
    pieces = [words(t) for t in WORD_TEXTS]
    lengths = iter(_lengths(backend, [p for ps in pieces for p in ps]))
    return [sum(next(lengths) for _ in ps) for ps in pieces] == _lengths(backend, list(WORD_TEXTS))


# The same shortcuts for token ids (text_ids.py): what is built from the parts is the whole text's ids, not only as
# many of them.


def ids_segments_agree(backend: Any, segmenter: Segmenter) -> bool:
    if segmenter.refusal is not None:
        return True  # whole texts only: exact by construction
    added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
    texts = probe_texts(probed_contents(backend))
    cuts = [segmenter.in_order(t) or [] for t in texts]
    encoded = iter(_ids(backend, [p.text for cut in cuts for p in cut if not p.added]))
    built = [[i for p in cut for i in ([added[p.text]] if p.added else next(encoded))] for cut in cuts]
    return built == _ids(backend, texts)


def ids_splits_agree(backend: Any, splitter: Splitter) -> bool:
    eager = _eager(splitter)
    return [[i for ids in _ids(backend, eager.split(t)) for i in ids] for t in SPLIT_TEXTS] == _ids(
        backend, list(SPLIT_TEXTS)
    )


def ids_words_agree(backend: Any) -> bool:
    return [[i for ids in _ids(backend, words(t)) for i in ids] for t in WORD_TEXTS] == _ids(backend, list(WORD_TEXTS))


def probed_contents(backend: Any) -> list[str]:
    """Tokens that strip whitespace or match after normalization first: they are the ones a cut can get wrong."""
    tokens = sorted(backend.get_added_tokens_decoder().items())
    ranked = sorted(tokens, key=lambda item: not (item[1].lstrip or item[1].rstrip or item[1].normalized))
    return [t.content for _, t in ranked if t.content]


def _eager(splitter: Splitter) -> Splitter:
    return replace(splitter, parts=max(8, splitter.parts), min_chars=0)  # splits the short samples, many ways


def _lengths(backend: Any, texts: list[str]) -> list[int]:
    return [len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=False)] if texts else []


def _ids(backend: Any, texts: list[str]) -> list[list[int]]:
    return [list(e.ids) for e in backend.encode_batch_fast(texts, add_special_tokens=False)] if texts else []
