"""The chunk policy's split of a chat prompt: the windows cover the text exactly once, in order, and each part fits."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.api.chat import parse_chat
from proxy.counting.local_count import count_chat
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.policy.chunk import CannotChunk, output_shares, split_chat
from tests.support.documents import SENTENCES

TEXT = st.lists(st.sampled_from(SENTENCES + [" ", "\n\n", "  indented", "😀😀", "。", "tail"]), min_size=50,
                max_size=400).map(" ".join)  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=TEXT, size=st.integers(40, 300), overlap=st.integers(0, 19), prefix=st.sampled_from([None, "Part {i}/{n}:"])
)
def test_chat_windows_cover_the_text_exactly_once_in_order_and_each_part_fits(
    guard_tok: ModelTokenizer, guard_counter: TokenCounter, text: str, size: int, overlap: int, prefix: str | None
) -> None:
    tok = guard_tok
    req = parse_chat(json.dumps({"messages": [{"role": "system", "content": "S"},
                                              {"role": "user", "content": text}]}).encode())  # fmt: skip

    async def count(messages: list[Any]) -> int:
        return await count_chat(tok, parse_chat(json.dumps({"messages": messages}).encode()), guard_counter)

    budget = 400
    split = asyncio.run(split_chat(tok, req, budget, size, overlap, prefix, count))
    assert split.spans[0][0] == 0 and split.spans[-1][1] == len(text)
    for (_, end), (start, _) in zip(split.spans, split.spans[1:], strict=False):
        assert start <= end and (overlap > 0 or start == end)  # consecutive, overlapping only when asked
    if overlap == 0:
        assert "".join(text[s:e] for s, e in split.spans) == text
    assert all(n <= budget for n in split.prompt_tokens)
    for i, messages in enumerate(split.prompts):
        assert messages[0] == {"role": "system", "content": "S"}
        assert messages[1]["content"].endswith(text[split.spans[i][0] : split.spans[i][1]])


def test_output_shares_split_the_clients_limit_across_the_parts_in_order() -> None:
    assert output_shares(64, 4) == [16, 16, 16, 16]
    assert output_shares(10, 4) == [3, 3, 2, 2]
    assert sum(output_shares(1000, 7)) == 1000
    with pytest.raises(CannotChunk, match="cannot be shared by 5 chunks"):
        output_shares(4, 5)
