"""The cache key of a long text: its digest, taken a slice at a time, must be the digest of the whole text."""

import hashlib

from proxy.counting.memo import DIGEST_SLICE_CHARS, LONG_KEY_CHARS, key_of


def _whole_digest(text: str) -> str:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"\x00{len(text)}:{digest}"


def test_a_short_text_is_its_own_key() -> None:
    text = "x" * LONG_KEY_CHARS
    assert key_of(text) is text


def test_a_long_text_is_keyed_by_the_digest_of_all_its_bytes_across_slices() -> None:
    # wide characters and a lone surrogate right at a slice boundary: each slice's bytes must join up exactly
    text = "héllo wörld 🙂 " * (DIGEST_SLICE_CHARS // 5) + "\ud800" + "tail"
    text = text[: DIGEST_SLICE_CHARS - 1] + "\ud800🙂" + text[DIGEST_SLICE_CHARS + 1 :]
    assert len(text) > 2 * DIGEST_SLICE_CHARS
    assert key_of(text) == _whole_digest(text)
    assert key_of(text) != key_of(text[:-1] + "X")
