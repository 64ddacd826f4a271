"""Cut a rendered prompt at its added tokens exactly as `tokenizers` does before anything else, so the text between
them can be counted, and cached, piece by piece: each added token is one token, and each piece encodes alone just as
it does in place.

tokenizers matches the added tokens that are not `normalized` on the raw text first (leftmost-longest, honouring
lstrip and rstrip), then the `normalized` ones inside each remaining piece after normalizing it. Only what can be
reproduced exactly is cut here; anything else leaves the text whole, which is always exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from proxy.counting.components import WHITESPACE, steps

SEARCH_WINDOW = 2**18  # characters a search for added tokens covers at once (a few ms of holding the lock)

# Pre-tokenizers that treat every piece alike wherever it sits in the text (Metaspace only with this check below).
PIECEWISE_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "BertPreTokenizer",
     "UnicodeScripts", "CharDelimiterSplit", "FixedLength", "Metaspace"}
)  # fmt: skip


@dataclass(frozen=True)
class AddedTokenRule:
    content: str
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


class Piece(NamedTuple):
    text: str  # a piece of text between added tokens, or an added token's content
    added: bool = False


@dataclass(frozen=True)
class Cut:
    texts: tuple[str, ...]  # the text between the added tokens, in order
    added: int  # how many added tokens were cut out; each is one token


class Segmenter:
    def __init__(self, rules: Iterable[AddedTokenRule], *, normalizes: bool = False, refusal: str | None = None):
        self._rules = {r.content: r for r in rules if r.content}
        self._longest = max((len(c) for c in self._rules), default=0)
        raw = [r for r in self._rules.values() if not r.normalized]
        # With a normalizer, `normalized` tokens are matched in normalized text: leave them inside the pieces,
        # where tokenizers finds them again exactly as in place.
        later = [] if normalizes else [r for r in self._rules.values() if r.normalized]
        self._passes = [p for p in (_alternation(raw), _alternation(later)) if p is not None]
        self.refusal = refusal or _flag_refusal(raw) or _flag_refusal(later)

    def cut(self, text: str) -> Cut:
        """The pieces between added tokens; the whole text as one piece if it cannot be cut exactly."""
        if self.refusal is not None or not text:
            return Cut((text,), 0)
        pieces, added = [text], 0
        for pattern in self._passes:
            remaining: list[str] = []
            for piece in pieces:
                gaps, tokens = self._split(piece, pattern)
                remaining += filter(None, gaps)
                added += len(tokens)
            pieces = remaining
        return Cut(tuple(pieces), added)

    def in_order(self, text: str) -> list[Piece] | None:
        """The text as its pieces and added tokens in order (what token ids are made of); None if it cannot be cut
        exactly."""
        if self.refusal is not None:
            return None
        pieces: list[Piece] = [Piece(text)] if text else []
        for pattern in self._passes:
            remaining: list[Piece] = []
            for piece in pieces:
                if piece.added:
                    remaining.append(piece)
                    continue
                gaps, tokens = self._split(piece.text, pattern)
                for gap, token in zip(gaps, [*tokens, None], strict=True):
                    if gap:
                        remaining.append(Piece(gap))
                    if token is not None:
                        remaining.append(Piece(token, added=True))
            pieces = remaining
        return pieces

    def _split(self, text: str, pattern: re.Pattern[str]) -> tuple[list[str], list[str]]:
        """The text around each added token (empty ones too: one more than the tokens), and the tokens' contents."""
        gaps: list[str] = []
        tokens: list[str] = []
        end = 0  # where the previous added token, with the whitespace it stripped, ended
        for match in _finditer(pattern, text, self._longest):
            start, stop = match.span()
            rule = self._rules[match.group()]
            if rule.lstrip:
                start = max(_whitespace_before(text, start), end)
            if rule.rstrip:
                stop = _whitespace_after(text, stop)
            gaps.append(text[end:start])
            tokens.append(rule.content)
            end = stop
        gaps.append(text[end:])
        return gaps, tokens


def _finditer(pattern: re.Pattern[str], text: str, longest: int) -> Iterator[re.Match[str]]:
    """pattern.finditer(text), searched a window at a time: one search over a 30 MB text holds the interpreter lock
    for a fifth of a second (also in a worker thread, the event loop waits). A match starting in a window is found
    whole, since the search reaches `longest` characters past it; one starting after it is left to the next."""
    if len(text) <= SEARCH_WINDOW:
        yield from pattern.finditer(text)
        return
    pos = 0
    while pos < len(text):
        end = min(pos + SEARCH_WINDOW, len(text))
        resume = end
        for match in pattern.finditer(text, pos, min(end + longest, len(text))):
            if match.start() >= end:
                break
            yield match
            resume = max(end, match.end())
        pos = resume


def _flag_refusal(rules: list[AddedTokenRule]) -> str | None:
    if any(r.single_word for r in rules):
        return "added tokens that match single words only (word boundaries as the Rust regex crate sees them)"
    if any(r.rstrip for r in rules) and any(r.content[0] in WHITESPACE and not r.lstrip for r in rules):
        return "an added token starting with whitespace that another one may strip (tokenizers overlaps them)"
    return None


def segmenter_for(backend: Any) -> Segmenter:
    """The segmenter for a `tokenizers.Tokenizer`, refusing to cut when a piece would not encode alone as in place."""
    rules = [
        AddedTokenRule(t.content, t.lstrip, t.rstrip, t.single_word, t.normalized)
        for t in backend.get_added_tokens_decoder().values()
    ]
    return Segmenter(rules, normalizes=bool(steps(backend.normalizer)), refusal=_pipeline_refusal(backend))


def _pipeline_refusal(backend: Any) -> str | None:
    if getattr(backend, "encode_special_tokens", False):
        return "encode_special_tokens is on (special tokens are encoded as text)"
    for step in steps(backend.pre_tokenizer):
        kind = step.get("type")
        if kind not in PIECEWISE_PRE_TOKENIZERS or step.get("prepend_scheme") == "first":
            return f"its {kind} pre-tokenizer may treat the first piece of a text differently"
    return None


def _alternation(rules: list[AddedTokenRule]) -> re.Pattern[str] | None:
    """One pattern that finds the added tokens, shaped as a trie: at each position it follows the text character by
    character through the tokens that start there and takes the longest that ends (as tokenizers does), instead of
    trying a thousand alternatives one after the other."""
    contents = sorted({r.content for r in rules})
    if not contents:
        return None
    trie: dict[str, Any] = {}
    for content in contents:
        node = trie
        for char in content:
            node = node.setdefault(char, {})
        node[""] = {}
    return re.compile(_trie_pattern(trie))


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [re.escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if "" in node else body  # a token ends here: longer ones first, greedily


def _whitespace_before(text: str, i: int) -> int:
    while i > 0 and text[i - 1] in WHITESPACE:
        i -= 1
    return i


def _whitespace_after(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i
