"""A strict reader of multipart/form-data bodies (RFC 7578): where each part lies, the text of its fields, and the
body with one field's value replaced or added. A file part is only located, never decoded or copied."""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.errors import InvalidRequest

MAX_FIELD_BYTES = 64 * 1024  # a text field longer than this is no setting (a file belongs in a file part)
MAX_HEADER_BYTES = 8 * 1024  # the headers of one part
MAX_PARTS = 256
_PARAM = re.compile(r';\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,./:=? -]{0,69}[0-9A-Za-z'()+_,./:=?-]")  # RFC 2046's bchars


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None  # set for a file part
    start: int  # the value's bytes in the body: body[start:end]
    end: int


@dataclass(frozen=True)
class Form:
    boundary: bytes
    parts: list[Part]
    fields: dict[str, str]  # each text field's value; of a repeated field, the last (as Starlette reads a form)
    closing: int  # where the CRLF before the closing delimiter starts: a new part goes there

    def part(self, name: str) -> Part | None:
        return next((p for p in reversed(self.parts) if p.name == name), None)

    def with_field(self, raw: bytes, name: str, value: str) -> bytes:
        """The body with text field `name` set to `value`: that part's value bytes replaced (its last one, the one a
        server reads), else a part added at the end; every other byte kept."""
        part, data = self.part(name), value.encode()
        if part is not None and part.filename is None:
            return raw[: part.start] + data + raw[part.end :]
        head = b'\r\n--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n' % (self.boundary, name.encode())
        added = head + data
        return raw[: self.closing] + added + raw[self.closing :]


def read_form(raw: bytes, content_type: str) -> Form:
    delimiter = b"--" + boundary_of(content_type)
    position = _first_delimiter(raw, delimiter)
    parts: list[Part] = []
    fields: dict[str, str] = {}
    while True:
        position += len(delimiter)
        if raw.startswith(b"--", position):
            if not parts:
                raise _malformed("it has no parts")
            return Form(delimiter[2:], parts, fields, position - len(delimiter) - 2)
        if not raw.startswith(b"\r\n", position):
            raise _malformed("a boundary line is not followed by CRLF")
        if len(parts) == MAX_PARTS:
            raise _malformed(f"it has more than {MAX_PARTS} parts")
        part = _part(raw, position + 2, delimiter)
        parts.append(part)
        if part.filename is None:
            fields[part.name] = _text(raw, part)
        position = part.end + 2


def boundary_of(content_type: str) -> bytes:
    media_type, _, params = content_type.partition(";")
    if media_type.strip().lower() != "multipart/form-data":
        raise InvalidRequest(
            f"This endpoint takes a multipart/form-data body (the audio file and the form's fields), got "
            f"{media_type.strip() or 'no content type'!r}.",
            param="file",
        )
    found = {k.lower(): _unquote(v) for k, v in _PARAM.findall(";" + params)}
    boundary = found.get("boundary")
    if not boundary:
        raise InvalidRequest("The multipart/form-data content type has no boundary parameter.", param="file")
    if not _BOUNDARY.fullmatch(boundary):
        raise InvalidRequest(f"The multipart boundary {boundary!r} is not a valid one (RFC 2046: 1 to 70 characters "
                             "of a limited set).", param="file")  # fmt: skip
    return boundary.encode("ascii")


def _first_delimiter(raw: bytes, delimiter: bytes) -> int:
    """The first delimiter line: at the start, or after a preamble and its CRLF."""
    if raw.startswith(delimiter):
        return 0
    found = raw.find(b"\r\n" + delimiter)
    if found == -1:
        raise _malformed("its boundary never occurs in it")
    return found + 2


def _part(raw: bytes, start: int, delimiter: bytes) -> Part:
    head_end = raw.find(b"\r\n\r\n", start, start + MAX_HEADER_BYTES)
    if head_end == -1:
        raise _malformed("a part's headers do not end (with an empty line) within 8 KiB")
    name, filename = _disposition(raw[start:head_end])
    value_start = head_end + 4
    value_end = raw.find(b"\r\n" + delimiter, value_start)
    if value_end == -1:
        raise _malformed(f"part {name!r} is not closed by a boundary")
    return Part(name, filename, value_start, value_end)


def _disposition(head: bytes) -> tuple[str, str | None]:
    try:
        text = head.decode()
    except UnicodeDecodeError:
        text = head.decode("latin-1")
    for line in text.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() != "content-disposition":
            continue
        kind, _, params = value.partition(";")
        if kind.strip().lower() != "form-data":
            raise _malformed(f"a part's Content-Disposition is {kind.strip()!r}, not form-data")
        found = {k.lower(): _unquote(v) for k, v in _PARAM.findall(";" + params)}
        if not found.get("name"):
            raise _malformed("a part has no name")
        return found["name"], found.get("filename")
    raise _malformed("a part has no Content-Disposition header")


def _text(raw: bytes, part: Part) -> str:
    if part.end - part.start > MAX_FIELD_BYTES:
        raise InvalidRequest(f"The form field {part.name!r} is longer than {MAX_FIELD_BYTES // 1024} KiB.",
                             param=part.name)  # fmt: skip
    try:
        return raw[part.start : part.end].decode()
    except UnicodeDecodeError:
        raise InvalidRequest(f"The form field {part.name!r} is not UTF-8 text.", param=part.name) from None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(f"The multipart/form-data body is malformed: {why}.", param="file")
