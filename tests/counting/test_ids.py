"""Token-id helpers of the cutting policies: windows over ids, and cuts that never split a character."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.counting.ids import char_cut, chunk_spans


@given(length=st.integers(0, 5000), size=st.integers(2, 600), overlap_share=st.floats(0, 0.49))
def test_windows_cover_everything_in_order_with_the_overlap(length: int, size: int, overlap_share: float) -> None:
    overlap = int(size * overlap_share)
    spans = chunk_spans(length, size, overlap)
    if length == 0:
        assert spans == []
        return
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert all(0 < e - s <= size for s, e in spans)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start == end - overlap


def test_char_cut_never_splits_a_character() -> None:
    starts = [0, 1, 1, 1, 2]  # token 1..3 are the bytes of one character
    assert [char_cut(starts, i, 3) for i in range(6)] == [0, 1, 2, 2, 2, 3]
