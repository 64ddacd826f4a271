"""A strict reader of multipart/form-data bodies (RFC 7578): where each part lies and the text of its fields; and the
form written anew from what was read (`Form.canonical`), which is what goes upstream. A file part is only located,
never decoded; written anew, its bytes are copied once.

Why anew, and not the client's bytes: vLLM reads a form with python-multipart (Starlette's `Request.form()`), whose
reading of an odd form can differ from any other reader's: the last of two Content-Disposition headers in a part,
`name*` and `filename*` ignored, a `charset` in the request's Content-Type, LF-only line ends, header folding, quoting
and escaping, a preamble or epilogue, and of two Content-Type headers (Envoy forwards both) the first. Once written
anew (each part read, each once, with one Content-Disposition, a boundary of the guard's own that occurs nowhere in
the values, and a Content-Type of the guard's own) there is one reading left: the guard's. Refusing each quirk
instead would leave every one not thought of. Writing anew costs a copy of the body and a search for the boundary:
for 25 MiB of audio about 8 ms, 35 ms on memory just given back to the system (as it is after each large body), and
the body's size in memory while it is forwarded. A form the client already wrote so (httpx, and so the OpenAI SDK,
writes forms byte for byte as _head does) goes as it came, with the guard's Content-Type: the bytes between the values
are compared, and nothing is copied.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from proxy.errors import InvalidRequest

MAX_FIELD_BYTES = 64 * 1024  # a text field longer than this is no setting (a file belongs in a file part)
MAX_HEADER_BYTES = 8 * 1024  # the headers of one part
MAX_PARTS = 256
_PARAM = re.compile(r';\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,./:=? -]{0,69}[0-9A-Za-z'()+_,./:=?-]")  # RFC 2046's bchars
_NAME = re.compile(r"[0-9A-Za-z_.\[\]-]+")  # a name written anew needs no quoting or escaping
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a boundary that needs no quotes in the Content-Type
_MEDIA_TYPE = re.compile(r"[0-9A-Za-z!#$&^_.+-]+/[0-9A-Za-z!#$&^_.+-]+")
_UNSAFE_IN_QUOTES = re.compile(r'["\\%\x00-\x1f\x7f]')  # percent-encoded in a filename written anew


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None  # set for a file part
    start: int  # the value's bytes in the body: body[start:end]
    end: int
    value: str | None = None  # a text part's value (None for a file part)
    media_type: str | None = None  # the part's own Content-Type, when it is a plain type/subtype


@dataclass(frozen=True)
class Form:
    boundary: bytes
    parts: list[Part]

    @property
    def fields(self) -> dict[str, str]:
        """Each text field's value; of a repeated field, the last (as Starlette reads a form)."""
        return {p.name: p.value for p in self.parts if p.value is not None}

    def part(self, name: str) -> Part | None:
        return next((p for p in reversed(self.parts) if p.name == name), None)

    def canonical(self, raw: bytes, changes: dict[str, str]) -> tuple[bytes, str]:
        """The form written anew, with its Content-Type: every part as read, in order, the text fields in `changes`
        set to their new value (added at the end when absent). The client's own bytes when, unchanged, they already
        are that form in their own boundary: how httpx, and so the OpenAI SDK, writes a form."""
        if not changes and self._written_so(raw):
            return raw, _content_type(self.boundary)
        boundary = _fresh_boundary(raw, changes)
        added = [Part(name, None, 0, 0, value) for name, value in changes.items() if self.part(name) is None]
        pieces: list[bytes | memoryview] = []
        view = memoryview(raw)
        for part in [*self.parts, *added]:
            pieces.append(b"--%s\r\n%s\r\n" % (boundary, _head(part)))
            if part.value is None:
                pieces.append(view[part.start : part.end])
            else:
                pieces.append(changes.get(part.name, part.value).encode())
            pieces.append(b"\r\n")
        pieces.append(b"--%s--\r\n" % boundary)
        return b"".join(pieces), _content_type(boundary)

    def _written_so(self, raw: bytes) -> bool:
        """Whether `raw` is byte for byte the form written anew in its own boundary: each part's headers as _head
        writes them right after its delimiter line, its value (read up to the first CRLF and delimiter), and nothing
        after the closing delimiter. Only the bytes around the values are compared: the file is not copied."""
        position = 0
        for part in self.parts:
            head = b"--%s\r\n%s\r\n" % (self.boundary, _head(part))
            if part.start - position != len(head) or not raw.startswith(head, position):
                return False
            position = part.end + 2  # the CRLF before the next delimiter, which the reader found there
        closing = b"--%s--\r\n" % self.boundary
        return len(raw) - position == len(closing) and raw.endswith(closing)


def read_form(raw: bytes, content_type: str) -> Form:
    delimiter = b"--" + boundary_of(content_type)
    position = _first_delimiter(raw, delimiter)
    parts: list[Part] = []
    while True:
        position += len(delimiter)
        if raw.startswith(b"--", position):
            if not parts:
                raise _malformed("it has no parts")
            return Form(delimiter[2:], parts)
        if not raw.startswith(b"\r\n", position):
            raise _malformed("a boundary line is not followed by CRLF")
        if len(parts) == MAX_PARTS:
            raise _malformed(f"it has more than {MAX_PARTS} parts")
        part = _part(raw, position + 2, delimiter)
        parts.append(part)
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
    name, filename, media_type = _headers(raw[start:head_end])
    value_start = head_end + 4
    value_end = raw.find(b"\r\n" + delimiter, value_start)
    if value_end == -1:
        raise _malformed(f"part {name!r} is not closed by a boundary")
    value = None if filename is not None else _text(raw, name, value_start, value_end)
    return Part(name, filename, value_start, value_end, value, media_type)


def _headers(head: bytes) -> tuple[str, str | None, str | None]:
    """A part's name and filename (its one Content-Disposition), and its media type."""
    try:
        text = head.decode()
    except UnicodeDecodeError:
        text = head.decode("latin-1")
    dispositions, media_type = [], None
    for line in text.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-disposition":
            dispositions.append(value)
        elif key.strip().lower() == "content-type" and _MEDIA_TYPE.fullmatch(value.strip()):
            media_type = value.strip()
    if not dispositions:
        raise _malformed("a part has no Content-Disposition header")
    name, filename = _disposition(dispositions[0])
    if len(dispositions) > 1:  # python-multipart, and so vLLM, reads the last; the guard would read the first
        raise _malformed(f"part {name!r} has {len(dispositions)} Content-Disposition headers, not one")
    return name, filename, media_type


def _disposition(value: str) -> tuple[str, str | None]:
    kind, _, params = value.partition(";")
    if kind.strip().lower() != "form-data":
        raise _malformed(f"a part's Content-Disposition is {kind.strip()!r}, not form-data")
    pairs = [(k.lower(), _unquote(v)) for k, v in _PARAM.findall(";" + params)]
    found = dict(pairs)
    if not found.get("name"):
        raise _malformed("a part has no name")
    if len(found) < len(pairs):
        raise _malformed(f"part {found['name']!r} has a Content-Disposition parameter given twice")
    return found["name"], found.get("filename")


def _text(raw: bytes, name: str, start: int, end: int) -> str:
    if end - start > MAX_FIELD_BYTES:
        raise InvalidRequest(f"The form field {name!r} is longer than {MAX_FIELD_BYTES // 1024} KiB.", param=name)
    try:
        return raw[start:end].decode()
    except UnicodeDecodeError:
        raise InvalidRequest(f"The form field {name!r} is not UTF-8 text.", param=name) from None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _head(part: Part) -> bytes:
    """A part's headers written anew: a name that needs no quoting (the reader of the route's form takes only the
    names of its fields), a filename percent-encoded where python-multipart would unescape or cut it."""
    if not _NAME.fullmatch(part.name):
        raise InvalidRequest(f"The form part {part.name!r} has a name token-guard does not forward.", param=part.name)
    head = f'Content-Disposition: form-data; name="{part.name}"'
    if part.value is None:
        filename = _UNSAFE_IN_QUOTES.sub(lambda m: f"%{ord(m.group()):02X}", part.filename or "")
        head += f'; filename="{filename}"\r\nContent-Type: {part.media_type or "application/octet-stream"}'
    return head.encode() + b"\r\n"


def _content_type(boundary: bytes) -> str:
    value = boundary.decode()
    return f"multipart/form-data; boundary={value if _TOKEN.fullmatch(value) else chr(34) + value + chr(34)}"


def _fresh_boundary(raw: bytes, changes: dict[str, str]) -> bytes:
    """A boundary found nowhere in the body or the new values: so nowhere in what is written anew."""
    while True:
        boundary = b"token-guard-" + secrets.token_hex(16).encode()
        if boundary not in raw and not any(boundary in value.encode() for value in changes.values()):
            return boundary


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(f"The multipart/form-data body is malformed: {why}.", param="file")
