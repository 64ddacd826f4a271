"""Reading any request body: one JSON object, bounded nesting, and a rewrite that changes only the given fields."""

from __future__ import annotations

import json

import pytest

from proxy.api.body import parse_json_object, with_changes
from proxy.api.chat import parse_chat
from proxy.errors import InvalidRequest

OK_MESSAGES = [{"role": "user", "content": "hi"}]


def test_deeply_nested_json_is_a_clear_400() -> None:
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        parse_chat(b"[" * 100_000 + b"]" * 100_000)


def test_rewrite_changes_only_the_given_fields_and_keeps_key_order() -> None:
    body = {"model": "m", "max_tokens": 9000, "messages": OK_MESSAGES, "extra_field": {"ü": [1, None]}}
    rewritten = json.loads(with_changes(body, {"max_tokens": 100}))
    assert list(rewritten) == list(body)
    assert rewritten == {**body, "max_tokens": 100}
    assert "ü".encode() in with_changes(body, {})


def chat_text(content: str = "hi", extra: str = "") -> str:
    return '{"model": "m", "messages": [{"role": "user", "content": "' + content + '"}], "max_tokens": 3' + extra + "}"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_a_body_in_another_encoding_than_utf8_is_refused_before_it_is_scanned(encoding: str) -> None:
    # "∀" (U+2200) holds a byte 0x22 in UTF-16 and UTF-32, a quote to a scan of the bytes as UTF-8 text: the bombs
    # behind it would look like the inside of a string
    deep = chat_text(extra=', "hidden": "∀", "unused": ' + "[" * 100 + "]" * 100)
    many = chat_text(extra=', "hidden": "∀", "unused": [' + ",".join(["[]"] * 200_000) + "]")
    for text in (chat_text(), deep, many):
        with pytest.raises(InvalidRequest, match=f"The request body is {encoding.upper()}.* must be UTF-8 \\(RFC 8259"):
            parse_json_object(text.encode(encoding))


def test_a_lone_surrogate_in_utf16_is_a_400_that_names_the_encoding() -> None:
    raw = chat_text("a\ud800b").encode("utf-16-le", "surrogatepass")
    with pytest.raises(InvalidRequest, match="UTF-16-LE text"):
        parse_json_object(raw)


def test_a_utf8_byte_order_mark_is_read_past_as_vllm_reads_it() -> None:
    raw = chat_text("東京").encode()
    assert json.loads(b"\xef\xbb\xbf" + raw) == parse_json_object(b"\xef\xbb\xbf" + raw) == parse_json_object(raw)
    assert not with_changes(parse_json_object(b"\xef\xbb\xbf" + raw), {}).startswith(b"\xef\xbb\xbf")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (chat_text("a\udc00b").encode("utf-8", "surrogatepass"), "it holds a lone surrogate (\\udc00)"),
        (chat_text("\ud83d\ude00").encode("utf-8", "surrogatepass"), "it holds a lone surrogate (\\ud83d"),
        (chat_text("\\ud800").encode(), "it holds a lone surrogate (\\ud800)"),
        (chat_text("caf\xe9").encode("latin-1"), "not valid UTF-8: invalid continuation byte at byte 60"),
        (chat_text().encode()[:-1] + b"\xff}", "not valid UTF-8: invalid start byte"),
    ],
    ids=["surrogate bytes", "a pair as two surrogates' bytes (CESU-8)", "escaped", "latin-1", "a stray byte"],
)
def test_text_that_is_not_utf8_is_a_400_that_says_so(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json_object(raw)
    assert message in caught.value.message


def test_korean_text_which_shares_its_lead_byte_with_the_surrogates_is_read() -> None:
    raw = chat_text("한국어 텍스트 힣").encode()  # U+D000-U+D7FF: ED 80-9F ..
    assert b"\xed" in raw and parse_json_object(raw)["messages"][0]["content"] == "한국어 텍스트 힣"
