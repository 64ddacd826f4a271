"""Reading torch.save's zip from base64 text: only what torch.save writes, and nothing two zip readers could read two
ways (torch's miniz and this reader must find the same data.pkl, or the guard counts one tensor and vLLM runs
another)."""

from __future__ import annotations

import base64
import struct
import zipfile
import zlib
from collections.abc import Callable

import pytest

from proxy.api.torch_zip import END, END64, LOCATOR, MAX_MEMBERS, Unreadable, member
from tests.support.torch_save import archive, saved, tensor_pickle

PICKLE = tensor_pickle((3, 8))


def text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def read(raw: bytes) -> bytes:
    return member(text(raw), b"data.pkl", 64 * 1024)


def unreadable(raw: bytes | str) -> str:
    with pytest.raises(Unreadable) as info:
        member(raw if isinstance(raw, str) else text(raw), b"data.pkl", 64 * 1024)
    return info.value.message


def with_zip64(raw: bytes, entries_delta: int = 0, offset_delta: int = 0) -> bytes:
    """`raw` with zip64's end record and locator before its classic end record, as torch.save writes them."""
    body, end = raw[: -END.size], raw[-END.size :]
    _, _, _, here, entries, size, offset, _ = END.unpack(end)
    record = END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, here + entries_delta, entries + entries_delta, size,
                        offset + offset_delta)  # fmt: skip
    return body + record + LOCATOR.pack(b"PK\x06\x07", 0, len(body), 1) + end


def test_reads_data_pkl_of_torch_saves_layout() -> None:
    assert read(saved((3, 8))) == PICKLE
    assert read(with_zip64(saved((3, 8)))) == PICKLE


def test_any_folder_name_as_torch_takes_the_first_entrys() -> None:
    assert read(archive([("model/data.pkl", PICKLE), ("model/data/0", b"\0" * 96)])) == PICKLE
    assert "has no data.pkl in its folder" in unreadable(archive([("a/x", b""), ("b/data.pkl", PICKLE)]))
    assert "has no data.pkl in its folder" in unreadable(archive([("data.pkl", PICKLE)]))


def test_a_deflated_data_pkl_is_inflated_within_its_limit() -> None:
    assert read(archive([("archive/data.pkl", PICKLE)], zipfile.ZIP_DEFLATED)) == PICKLE
    bomb = archive([("archive/data.pkl", b"\0" * (8 << 20))], zipfile.ZIP_DEFLATED)  # 8 MiB in 8 KiB
    assert "a tensor's takes a few hundred" in unreadable(bomb)


def test_a_directory_that_understates_what_inflates_is_refused() -> None:
    bomb = archive([("archive/data.pkl", b"\0" * (8 << 20))], zipfile.ZIP_DEFLATED)
    at = bomb.rindex(b"PK\x01\x02")
    lied = bomb[: at + 24] + struct.pack("<L", 100) + bomb[at + 28 :]  # the directory's uncompressed size: 100
    assert "size or checksum" in unreadable(lied)


@pytest.mark.parametrize(
    "raw,why",
    [(b"\x80\x02K\x01.", "not torch.save's zip format"), (b"PK\x03\x04" + b"\0" * 40, "end record"),
     (saved((3, 8))[:-4], "end record")],
)  # fmt: skip
def test_what_is_not_a_zip_torch_save_writes(raw: bytes, why: str) -> None:
    assert why in unreadable(raw)


@pytest.mark.parametrize("spoil", [lambda t: t[:-1], lambda t: "!" + t[1:], lambda t: "é" + t[1:],
                                   lambda t: t[:4] + "\n" + t[4:-1]])  # fmt: skip
def test_text_that_is_not_base64(spoil: Callable[[str], str]) -> None:
    assert "is not base64 text" in unreadable(spoil(text(saved((3, 8)))))


def test_a_comment_moves_the_end_record_and_is_refused() -> None:
    raw = saved((3, 8))
    commented = raw[:-2] + struct.pack("<H", 5) + b"hello"
    assert "end record is not the last 22 bytes" in unreadable(commented)


def test_two_entries_of_one_name_are_refused() -> None:
    # Python's zipfile would read the last, miniz may find either: the guard reads neither
    with pytest.warns(UserWarning, match="Duplicate name"):
        twice = archive([("archive/data.pkl", tensor_pickle((1, 8))), ("archive/data.pkl", tensor_pickle((4000, 8)))])
    assert "an entry repeated" in unreadable(twice)


def test_zip64_records_that_disagree_are_refused() -> None:
    assert "disagrees with its classic one" in unreadable(with_zip64(saved((3, 8)), offset_delta=30))
    assert "disagrees with its classic one" in unreadable(with_zip64(saved((3, 8)), entries_delta=1))


def test_more_members_than_a_tensor_has_are_refused() -> None:
    many = archive([("archive/data.pkl", PICKLE)] + [(f"archive/x{i}", b"") for i in range(MAX_MEMBERS)])
    assert f"more than {MAX_MEMBERS} members" in unreadable(many)


def test_a_local_header_that_is_not_the_entrys_is_refused() -> None:
    raw = saved((3, 8))
    renamed = raw.replace(b"archive/data.pkl", b"archive/data.pkx", 1)  # the local header's name only
    assert "local header" in unreadable(renamed)


def test_a_stored_pickle_whose_checksum_is_wrong_is_refused() -> None:
    raw = saved((3, 8))
    changed = raw.replace(PICKLE, PICKLE.replace(b"\x03\x00\x00\x00", b"\x09\x00\x00\x00"), 1)
    assert zlib.crc32(changed) != zlib.crc32(raw)
    assert "size or checksum" in unreadable(changed)
