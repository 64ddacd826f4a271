"""The cache key of a long text: its digest, taken a slice at a time, must be the digest of the whole text."""

import hashlib

from proxy.counting.memo import DIGEST_SLICE_CHARS, LONG_KEY_CHARS, Memo, entry_size, key_of


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


def test_sum_found_adds_what_the_young_generation_holds_and_returns_the_rest_as_often_as_it_occurs() -> None:
    memo: Memo[int] = Memo(10 * 2**20)
    memo.put("a", 1)
    memo.put(" b", 2)
    assert memo.sum_found(["a", " b", "a"]) == (4, [])
    assert memo.sum_found(["a", " new", " b", " new", "x" * (LONG_KEY_CHARS + 1)]) == (
        3, [" new", " new", "x" * (LONG_KEY_CHARS + 1)]  # a long text is kept under its digest: get_many finds it
    )  # fmt: skip


def test_sum_found_leaves_old_generation_entries_to_get_many_which_finds_and_promotes_them() -> None:
    memo: Memo[int] = Memo(2 * (entry_size("w0") * 4))  # a generation holds about four words
    for i in range(6):
        memo.put(f"w{i}", i)
    old = next(w for w in ("w0", "w1", "w2", "w3") if memo.sum_found([w])[1])  # aged into the old generation
    assert memo.get_many([old]) == ({old: int(old[1:])}, [])
    assert memo.sum_found([old]) == (int(old[1:]), [])  # promoted by the lookup
