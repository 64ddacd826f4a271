"""The multipart/form-data reader: real forms as httpx writes them, clear 400s for malformed ones, and the form
written anew, which python-multipart (Starlette's reader, and so vLLM's) reads exactly as the guard read it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartParser

from proxy.api.form import MAX_FIELD_BYTES, Form, read_form
from proxy.errors import InvalidRequest

AUDIO = b"RIFF\x00\xff\r\n--not-the-boundary\r\n" + bytes(range(256)) * 4  # binary, with CRLFs and dashes


def multipart(data: dict[str, Any], files: Any = None) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=data, files=files or {"file": ("a.wav", AUDIO, "audio/wav")})
    return request.read(), request.headers["content-type"]


def as_starlette_reads(raw: bytes, content_type: str) -> list[tuple[str, str | tuple[str | None, bytes]]]:
    """Every part as Starlette's Request.form() reads it (python-multipart): a text's value, a file's name and bytes."""

    async def read() -> list[tuple[str, str | tuple[str | None, bytes]]]:
        async def stream() -> AsyncGenerator[bytes, None]:
            yield raw

        form = await MultiPartParser(Headers({"content-type": content_type}), stream()).parse()
        items = [(k, v if isinstance(v, str) else (v.filename, await v.read())) for k, v in form.multi_items()]
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                await value.close()
        return items

    return asyncio.run(read())


def as_guard_reads(form: Form, raw: bytes) -> list[tuple[str, str | tuple[str | None, bytes]]]:
    return [(p.name, p.value if p.value is not None else (p.filename, raw[p.start : p.end])) for p in form.parts]


def test_fields_and_the_file_part_as_httpx_writes_them() -> None:
    raw, content_type = multipart({"model": "whisper", "language": "東京"})
    form = read_form(raw, content_type)
    assert form.fields == {"model": "whisper", "language": "東京"}
    file = form.part("file")
    assert file is not None and file.filename == "a.wav" and raw[file.start : file.end] == AUDIO
    assert file.media_type == "audio/wav"


def test_written_anew_with_a_boundary_of_its_own_the_form_reads_as_the_guard_read_it() -> None:
    raw, content_type = multipart({"max_completion_tokens": "4000", "model": "w"})
    form = read_form(raw, content_type)
    changed, kind = form.canonical(raw, {"max_completion_tokens": "7", "language": "en"})
    assert kind.startswith("multipart/form-data; boundary=token-guard-") and kind != content_type
    again = read_form(changed, kind)
    assert again.fields == {"max_completion_tokens": "7", "model": "w", "language": "en"}
    assert as_starlette_reads(changed, kind) == as_guard_reads(again, changed)
    file = again.part("file")
    assert file is not None and changed[file.start : file.end] == AUDIO


def test_a_form_httpx_wrote_is_the_form_written_anew_and_goes_as_it_came() -> None:
    """httpx (and so the OpenAI SDK) writes parts as the guard writes them: unchanged, the client's bytes are that
    form already, in the client's boundary, and are not copied."""
    raw, content_type = multipart({"max_completion_tokens": "4000", "model": "w"})
    form = read_form(raw, content_type)
    same, kind = form.canonical(raw, {})
    assert same is raw and kind == content_type
    assert as_starlette_reads(same, kind) == as_guard_reads(form, raw)
    for odd in (
        b"\r\n" + raw,
        raw + b"epilogue",
        raw.replace(b"Content-Type: audio/wav", b"Content-type: audio/wav"),
        raw.replace(b'name="model"', b"name=model"),
        raw.replace(b"\r\n\r\nw\r\n", b"\r\nX: y\r\n\r\nw\r\n"),
    ):
        anew, kind = read_form(odd, content_type).canonical(odd, {})
        assert anew != odd and kind.startswith("multipart/form-data; boundary=token-guard-"), odd[:80]
        assert as_starlette_reads(anew, kind) == as_starlette_reads(raw, content_type)


def test_a_value_that_begins_with_a_delimiter_line_is_a_value_to_both_readers() -> None:
    """The CRLF that ends a part's headers is no delimiter's: so the form goes as it came."""
    body = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n--b\r\nContent-Disposition: form-data; '
            b'name="n"\r\n\r\n8\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n")  # fmt: skip
    form = read_form(body, "multipart/form-data; boundary=b")
    assert form.fields == {"model": '--b\r\nContent-Disposition: form-data; name="n"\r\n\r\n8'}
    assert as_starlette_reads(body, "multipart/form-data; boundary=b") == as_guard_reads(form, body)
    assert form.canonical(body, {})[0] is body


def test_a_part_with_two_content_dispositions_is_refused_by_name() -> None:
    """python-multipart keeps the last of them (vLLM would read `max_completion_tokens`), a reader of the first would
    read a harmless field."""
    body = (b'--b\r\nContent-Disposition: form-data; name="temperature"\r\n'
            b'Content-Disposition: form-data; name="max_completion_tokens"\r\n\r\n100000\r\n--b--\r\n')  # fmt: skip
    assert as_starlette_reads(body, "multipart/form-data; boundary=b") == [("max_completion_tokens", "100000")]
    with pytest.raises(InvalidRequest, match="part 'temperature' has 2 Content-Disposition headers, not one"):
        read_form(body, "multipart/form-data; boundary=b")


def test_a_content_disposition_parameter_given_twice_is_refused() -> None:
    body = b'--b\r\nContent-Disposition: form-data; name="n"; name="model"\r\n\r\nx\r\n--b--\r\n'
    with pytest.raises(InvalidRequest, match="part 'model' has a Content-Disposition parameter given twice"):
        read_form(body, "multipart/form-data; boundary=b")


def test_quoted_parameters_and_a_preamble_are_read_and_a_filename_is_written_anew_safely() -> None:
    body = (b'preamble\r\n--b-1\r\nContent-Disposition: form-data; name="file"; filename="C:\\\\a \\"q\\"%.wav"\r\n'
            b"\r\nxyz\r\n--b-1--\r\n")  # fmt: skip
    form = read_form(body, 'multipart/form-data; boundary="b-1"')
    file = form.part("file")
    assert file is not None and file.filename == 'C:\\a "q"%.wav' and body[file.start : file.end] == b"xyz"
    anew, kind = form.canonical(body, {})
    assert as_starlette_reads(anew, kind) == [("file", ("C:%5Ca %22q%22%25.wav", b"xyz"))]


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


ODD = ["a", "é", "東", "\r", "\n", "-", '"', "\\", ";", " ", "=", "%", "\t"]
ODD_TEXT = st.text(st.sampled_from(ODD), max_size=12)
NAMES = st.sampled_from(["model", "prompt", "language", "n", "timestamp_granularities[]", "vllm_xargs"])


@settings(max_examples=200, deadline=None)
@given(
    fields=st.lists(st.tuples(NAMES, ODD_TEXT), max_size=6),
    filename=st.text(st.sampled_from(ODD), min_size=1, max_size=12),  # httpx writes no filename when it is empty
    audio=st.binary(max_size=64) | st.sampled_from([b"\r\n--", b"--token-guard-\r\n", b"\r\n\r\n--b--\r\n"]),
    changes=st.dictionaries(NAMES, ODD_TEXT, max_size=2),
)
def test_any_form_the_guard_reads_python_multipart_reads_alike_once_written_anew(
    fields: list[tuple[str, str]], filename: str, audio: bytes, changes: dict[str, str]
) -> None:
    files = [("file", (filename, audio, "audio/wav"))]
    request = httpx.Request("POST", "http://x/", data=None, files=[*[(k, (None, v.encode())) for k, v in fields],
                                                                   *files])  # fmt: skip
    raw, content_type = request.read(), request.headers["content-type"]
    form = read_form(raw, content_type)
    anew, kind = form.canonical(raw, changes)
    guard = read_form(anew, kind)
    assert as_starlette_reads(anew, kind) == as_guard_reads(guard, anew)
    expected = {**{name: value for name, value in fields}, **changes}
    file = guard.part("file")
    assert guard.fields == expected and file is not None and anew[file.start : file.end] == audio
