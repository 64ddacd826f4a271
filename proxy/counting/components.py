"""What a `tokenizers.Tokenizer` is made of, read from its components' own JSON: the steps of its normalizer and
pre-tokenizer, and how many tokens its post-processor adds. The counting engine decides from these which shortcuts
keep a count exact."""

from __future__ import annotations

import json
from typing import Any

WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)
"""Unicode White_Space: what `\\s` means to the Rust regex crate that tokenizers uses (Python's isspace differs)."""


def steps(component: Any) -> list[dict[str, Any]]:
    """The steps of a normalizer or pre-tokenizer, with nested `Sequence`s flattened; [] for none."""
    if component is None:
        return []
    return _flatten(json.loads(component.__getstate__()))


def _flatten(node: dict[str, Any]) -> list[dict[str, Any]]:
    if node.get("type") != "Sequence":
        return [node]
    children = node.get("normalizers", node.get("pretokenizers", []))
    return [step for child in children for step in _flatten(child)]


def added_special_tokens(backend: Any) -> int | None:
    """How many tokens `add_special_tokens=True` adds to any single text, or None if that is not one constant.

    Taken from the post-processor and confirmed on a few encodings, so a segmented count can add it once.
    """
    processor = backend.post_processor
    expected = processor.num_special_tokens_to_add(False) if processor is not None else 0
    probes = ["", "a", " Hello, world!\n", "東京 🎉"]
    with_specials = backend.encode_batch_fast(probes, add_special_tokens=True)
    plain = backend.encode_batch_fast(probes, add_special_tokens=False)
    added = {len(w) - len(p) for w, p in zip(with_specials, plain, strict=True)}
    return expected if added == {expected} else None
