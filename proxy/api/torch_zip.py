"""One member of a `torch.save` archive sent as base64 text (vLLM's `prompt_embeds`), read without decoding the whole.

torch.save writes a zip: every member under one folder (`archive/data.pkl`, `archive/data/0`, ...), stored
uncompressed, no comment, and a zip64 end record beside the classic one. torch.load (through miniz) finds the end
record, reads the central directory, takes the folder from its first entry and the member from the folder. This
reader does the same on a strict subset: it decodes only the base64 slices that hold the end records, the central
directory and the one member asked for, so what a request makes it decode is bounded whatever the tensor's size.
Anything torch.save does not write (a comment, encryption, duplicate names, records that disagree, more members or a
larger directory than a tensor needs) is refused: where two zip readers could read one archive two ways, the guard
reads it no way.
"""

from __future__ import annotations

import binascii
import struct
import zlib

from proxy.errors import InvalidRequest

MAX_MEMBERS = 16  # torch.save writes 7 for one tensor
MAX_DIRECTORY = MAX_MEMBERS * 1024
END = struct.Struct("<4s4H2LH")  # the classic end record: signature, disks, entries, directory size and offset
LOCATOR = struct.Struct("<4sLQL")  # zip64's locator, just before the end record
END64 = struct.Struct("<4sQ2H2L4Q")  # zip64's end record
ENTRY = struct.Struct("<4s6H3L5H2L")  # a central directory entry
LOCAL = struct.Struct("<4s5H3L2H")  # a member's local header
SATURATED = (0xFFFF, 0xFFFFFFFF)


class Unreadable(InvalidRequest):
    """Base64 text the guard cannot read as torch.save's archive; the message says why."""


class Base64Bytes:
    """The bytes base64 text decodes to, decoded a slice at a time (4 characters make 3 bytes)."""

    def __init__(self, text: str) -> None:
        if not text.isascii() or len(text) % 4:
            raise Unreadable("is not base64 text (padded, with no characters outside the base64 alphabet)")
        self.text = text
        self.size = len(text) // 4 * 3 - (2 if text.endswith("==") else 1 if text.endswith("=") else 0)

    def read(self, start: int, stop: int) -> bytes:
        if not 0 <= start <= stop <= self.size:
            raise Unreadable("points outside its own bytes")
        first, last = start // 3, -(-stop // 3)
        try:
            decoded = binascii.a2b_base64(self.text[first * 4 : last * 4], strict_mode=True)
        except binascii.Error:
            raise Unreadable("is not base64 text (padded, with no characters outside the base64 alphabet)") from None
        return decoded[start - first * 3 : stop - first * 3]


def member(text: str, name: bytes, limit: int) -> bytes:
    """The member `name` of the archive's folder (torch.save's `data.pkl`), at most `limit` bytes once inflated."""
    data = Base64Bytes(text)
    if data.size < END.size or data.read(0, 4) != b"PK\x03\x04":
        raise Unreadable("is not torch.save's zip format (the legacy format, or not a tensor at all)")
    offset, size, entries = _directory(data)
    directory = data.read(offset, offset + size)  # decoded once: at most MAX_DIRECTORY bytes
    folder, found, position = None, {}, 0
    for _ in range(entries):
        if position + ENTRY.size > size:
            raise Unreadable("has a central directory longer than it says")
        (sig, _made, _needed, flags, method, _t, _d, crc, packed, unpacked, name_len, extra_len, comment_len,
         _disk, _ia, _ea, local) = ENTRY.unpack_from(directory, position)  # fmt: skip
        entry_name = directory[position + ENTRY.size : position + ENTRY.size + name_len]
        if sig != b"PK\x01\x02" or entry_name in found or flags & 1 or SATURATED[1] in (packed, unpacked, local):
            raise Unreadable("is a zip archive torch.save does not write (an entry repeated, encrypted or zip64)")
        found[entry_name] = (method, crc, packed, unpacked, local)
        folder = folder if folder is not None else entry_name.partition(b"/")[0] if b"/" in entry_name else b""
        position += ENTRY.size + name_len + extra_len + comment_len
    wanted = folder + b"/" + name if folder else None
    if wanted is None or wanted not in found:
        raise Unreadable(f"has no {name.decode()} in its folder, as torch.save writes one")
    return _inflated(data, wanted, *found[wanted], limit)


def _directory(data: Base64Bytes) -> tuple[int, int, int]:
    """The central directory's offset, size and number of entries, from the end record (and zip64's, which must
    say the same)."""
    end = data.size - END.size
    sig, disk, cd_disk, here, entries, size, offset, comment = END.unpack(data.read(end, data.size))
    if sig != b"PK\x05\x06" or comment or disk or cd_disk or here != entries or SATURATED[0] == entries:
        raise Unreadable("is not torch.save's zip format (its end record is not the last 22 bytes)")
    if entries > MAX_MEMBERS or size > MAX_DIRECTORY:
        raise Unreadable(f"has more than {MAX_MEMBERS} members or a directory over {MAX_DIRECTORY} bytes")
    stop = end
    if end >= LOCATOR.size and data.read(end - LOCATOR.size, end - LOCATOR.size + 4) == b"PK\x06\x07":
        _, _, at, _ = LOCATOR.unpack(data.read(end - LOCATOR.size, end))
        if at + END64.size > end - LOCATOR.size:
            raise Unreadable("has a zip64 end record outside the archive")
        sig64, _, _, _, _, _, here64, entries64, size64, offset64 = END64.unpack(data.read(at, at + END64.size))
        if sig64 != b"PK\x06\x06" or (here64, entries64, size64, offset64) != (entries, entries, size, offset):
            raise Unreadable("has a zip64 end record that disagrees with its classic one")
        stop = at
    if offset + size > stop:
        raise Unreadable("has a central directory outside the archive")
    return offset, size, entries


def _inflated(data: Base64Bytes, name: bytes, method: int, crc: int, packed: int, unpacked: int, local: int,
              limit: int) -> bytes:  # fmt: skip
    if unpacked > limit or packed > limit + 1024:
        raise Unreadable(f"has a {name.decode()} of {unpacked} bytes; a tensor's takes a few hundred")
    sig, *_, name_len, extra_len = LOCAL.unpack(data.read(local, local + LOCAL.size))
    start = local + LOCAL.size + name_len + extra_len
    if sig != b"PK\x03\x04" or data.read(local + LOCAL.size, local + LOCAL.size + name_len) != name:
        raise Unreadable(f"has a local header for {name.decode()} that its directory does not point at")
    stored = data.read(start, start + packed) if start + packed <= data.size else b""
    if method == 0 and packed == unpacked:
        content = stored
    elif method == 8:
        try:
            content = zlib.decompressobj(-15).decompress(stored, limit + 1)
        except zlib.error:
            raise Unreadable(f"has a {name.decode()} that does not inflate") from None
    else:
        raise Unreadable(f"stores {name.decode()} in a way torch.save does not (method {method})")
    if len(content) != unpacked or zlib.crc32(content) != crc:
        raise Unreadable(f"has a {name.decode()} whose size or checksum is not its directory's")
    return content
