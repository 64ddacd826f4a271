"""The multipart/form-data reader: real forms as httpx writes them, and clear 400s for malformed ones."""

from __future__ import annotations

import httpx
import pytest

from proxy.api.form import MAX_FIELD_BYTES, read_form
from proxy.errors import InvalidRequest

AUDIO = b"RIFF\x00\xff\r\n--not-the-boundary\r\n" + bytes(range(256)) * 4  # binary, with CRLFs and dashes


def multipart(data: dict[str, str], files: dict[str, tuple[str, bytes, str]] | None = None) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=data, files=files or {"file": ("a.wav", AUDIO, "audio/wav")})
    return request.read(), request.headers["content-type"]


def test_fields_and_the_file_part_as_httpx_writes_them() -> None:
    raw, content_type = multipart({"model": "whisper", "language": "東京"})
    form = read_form(raw, content_type)
    assert form.fields == {"model": "whisper", "language": "東京"}
    file = form.part("file")
    assert file is not None and file.filename == "a.wav" and raw[file.start : file.end] == AUDIO


def test_a_field_is_replaced_or_added_and_every_other_byte_kept() -> None:
    raw, content_type = multipart({"max_completion_tokens": "4000", "model": "w"})
    form = read_form(raw, content_type)
    replaced = form.with_field(raw, "max_completion_tokens", "7")
    assert replaced == raw.replace(b"\r\n\r\n4000\r\n", b"\r\n\r\n7\r\n", 1)
    assert read_form(replaced, content_type).fields == {"max_completion_tokens": "7", "model": "w"}
    added = form.with_field(raw, "language", "en")
    again = read_form(added, content_type)
    assert again.fields["language"] == "en" and added.startswith(raw[: form.closing])
    file = again.part("file")
    assert file is not None and added[file.start : file.end] == AUDIO


def test_a_repeated_field_reads_as_its_last_value_as_starlette_reads_it() -> None:
    raw, content_type = multipart({"n": "1"})
    boundary = content_type.split("boundary=")[1].encode()
    extra = b'--%s\r\nContent-Disposition: form-data; name="n"\r\n\r\n3\r\n' % boundary
    form = read_form(extra + raw, content_type)
    assert form.fields["n"] == "1"
    assert read_form(raw.replace(b"--%s--" % boundary, extra + b"--%s--" % boundary), content_type).fields["n"] == "3"


def test_quoted_parameters_and_a_preamble_are_read() -> None:
    body = (b'preamble\r\n--b-1\r\nContent-Disposition: form-data; name="file"; filename="a \\"q\\".wav"\r\n\r\n'
            b'xyz\r\n--b-1--\r\n')  # fmt: skip
    form = read_form(body, 'multipart/form-data; boundary="b-1"')
    file = form.part("file")
    assert file is not None and file.filename == 'a "q".wav' and body[file.start : file.end] == b"xyz"


@pytest.mark.parametrize(
    "content_type,fragment",
    [
        ("application/json", "takes a multipart/form-data body"),
        ("", "takes a multipart/form-data body"),
        ("multipart/form-data", "has no boundary parameter"),
        ("multipart/form-data; boundary=" + "x" * 71, "is not a valid one"),
    ],
)
def test_the_content_type_must_say_multipart_with_a_boundary(content_type: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        read_form(b"--x\r\n", content_type)


@pytest.mark.parametrize(
    "body,fragment",
    [
        (b"no boundary here", "its boundary never occurs"),
        (b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nvalue', "part 'a' is not closed"),
        (b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--b', "not followed by CRLF"),
        (b'--b\r\nContent-Disposition: form-data; name="a"' + b"x" * 9000, "headers do not end"),
        (b"--b\r\nContent-Type: text/plain\r\n\r\n1\r\n--b--", "no Content-Disposition"),
        (b"--b\r\nContent-Disposition: form-data\r\n\r\n1\r\n--b--", "a part has no name"),
        (b'--b\r\nContent-Disposition: attachment; name="a"\r\n\r\n1\r\n--b--', "not form-data"),
        (b"--b--\r\n", "it has no parts"),
        (b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n\xff\r\n--b--', "not UTF-8 text"),
    ],
)
def test_malformed_forms_are_clear_400s(body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        read_form(body, "multipart/form-data; boundary=b")


def test_a_text_field_is_bounded_but_a_file_is_not() -> None:
    raw, content_type = multipart({"prompt": "x" * (MAX_FIELD_BYTES + 1)})
    with pytest.raises(InvalidRequest, match="longer than 64 KiB"):
        read_form(raw, content_type)
    big = b"\x00" * (4 * MAX_FIELD_BYTES)
    raw, content_type = multipart({}, {"file": ("a.wav", big, "audio/wav")})
    file = read_form(raw, content_type).part("file")
    assert file is not None and file.end - file.start == len(big)
