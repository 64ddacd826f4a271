"""Split a long piece of text into one part per core, only where the pre-tokenization provably stays the same, so
the parts can be encoded in parallel and their counts summed exactly.

The rule (from about 100,000 measured cuts): cut right before an ASCII space whose preceding character is not
whitespace. Newline-based cuts are not safe ("before a newline" after punctuation breaks the DeepSeek regex, "after
a blank line" followed by indentation breaks the GPT-2 one), so each candidate is also confirmed by pre-tokenizing a
window around it whole and in two halves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from proxy.counting.components import steps

PreTokenize = Callable[[str], list[tuple[str, tuple[int, int]]]]

WINDOW = 256  # characters pre-tokenized on each side of a candidate cut
TRIES = 32  # candidates tried per wanted cut before giving that cut up
# Regex-and-bytes pre-tokenizers, the families the rule was measured on; the normalizer must be empty.
SPLITTABLE_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits"})
SPACE_AFTER_WHITESPACE = re.compile(r"\s ")  # a space that is not a cut (re's \s is str.isspace()'s set)


def words(text: str) -> list[str]:
    """`text` cut at every candidate of the rule: word-sized pieces ("Hello", " world", ",  and" ...) that, for the
    pre-tokenizers the rule holds for, encode to exactly the tokens the whole text has. Counting them one by one lets
    a cache of pieces count fresh text that is made of familiar words. (A split on spaces, glued back where the space
    follows whitespace: 1.7x faster than a regex with a look-behind on long texts.)"""
    if not text.startswith(" ") and "\x00" not in text and SPACE_AFTER_WHITESPACE.search(text) is None:
        return text.replace(" ", "\x00 ").split("\x00")  # every space is a cut (the usual prose): at C speed
    parts = text.split(" ")
    if len(parts) == 1:
        return parts
    pieces = []
    current = parts[0]
    for part in parts[1:]:
        if current and not current[-1].isspace():  # a space after a non-space: a cut
            pieces.append(current)
            current = " " + part
        else:
            current += " " + part
    pieces.append(current)
    return pieces


def is_candidate(text: str, i: int) -> bool:
    return 0 < i < len(text) and text[i] == " " and not text[i - 1].isspace()


def window_agrees(text: str, i: int, pre_tokenize: PreTokenize, window: int = WINDOW) -> bool:
    """Cutting at `i` leaves the pre-tokens around it unchanged: `i` is a boundary, and each half alone
    pre-tokenizes into exactly the pre-tokens it had in the whole window."""
    lo, hi = max(0, i - window), min(len(text), i + window)
    cut = i - lo
    whole = pre_tokenize(text[lo:hi])
    left = [t for t in whole if t[1][1] <= cut]
    right = [(s, (a - cut, b - cut)) for s, (a, b) in whole if a >= cut]
    if len(left) + len(right) != len(whole):
        return False  # a pre-token straddles the cut
    if (lo > 0 and len(left) < 2) or (hi < len(text) and len(right) < 2):
        return False  # one pre-token reaches the window's edge: too little context to judge
    return pre_tokenize(text[lo:i]) == left and pre_tokenize(text[i:hi]) == right


def is_safe_cut(text: str, i: int, pre_tokenize: PreTokenize) -> bool:
    return is_candidate(text, i) and window_agrees(text, i, pre_tokenize)


SLICE_CHARS = 65536  # at most this much text is encoded at once (with a safe cut near it), to bound memory


@dataclass(frozen=True)
class Splitter:
    pre_tokenize: PreTokenize
    parts: int
    min_chars: int
    slice_chars: int = SLICE_CHARS

    def split(self, text: str) -> list[str]:
        """`text` in pieces of similar length, at least `parts` of them (one per core) and none much over
        `slice_chars`, or whole when short or without a safe cut."""
        if self.parts < 2 or len(text) < self.min_chars:
            return [text]
        pieces = max(self.parts, -(-len(text) // self.slice_chars))
        cuts = [c for c in (self._cut_near(text, len(text) * k // pieces) for k in range(1, pieces)) if c]
        bounds = [0, *sorted(set(cuts)), len(text)]
        return [text[a:b] for a, b in pairwise(bounds)]

    def _cut_near(self, text: str, target: int) -> int | None:
        i = text.find(" ", target)
        for _ in range(TRIES):
            if i < 0:
                return None
            if is_safe_cut(text, i, self.pre_tokenize):
                return i
            i = text.find(" ", i + 1)
        return None


def splitter_for(backend: Any, parts: int, min_chars: int) -> Splitter | None:
    """A splitter for a `tokenizers.Tokenizer`, or None when its pipeline is outside what the rule was proven on."""
    kinds = {step.get("type") for step in steps(backend.pre_tokenizer)}
    if steps(backend.normalizer) or not kinds or not kinds <= SPLITTABLE_PRE_TOKENIZERS:
        return None
    return Splitter(backend.pre_tokenizer.pre_tokenize_str, parts, min_chars)
