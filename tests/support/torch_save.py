"""Tensors in torch.save's format, written by hand (torch is not in the guard's environment): the zip with torch's
member names and order, and the protocol-2 pickle torch writes for a dense tensor, opcode for opcode. The e2e tests
send these to a real vLLM, which loads them with torch.load (tests/e2e/test_side_inputs.py,
tests/e2e/test_reading.py)."""

from __future__ import annotations

import base64
import io
import pickle
import struct
import zipfile

ITEM_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2}
LOCATOR, END64 = 20, 56  # the sizes of zip64's locator and end record


def _int(value: int) -> bytes:
    return pickle.BININT + struct.pack("<i", value)


def _text(value: str) -> bytes:
    raw = value.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def _tuple(values: tuple[int, ...]) -> bytes:
    return pickle.MARK + b"".join(_int(v) for v in values) + pickle.TUPLE


def tensor_pickle(shape: tuple[int, ...], dtype: str = "Float", key: str = "0", storage_numel: int | None = None,
                  rebuild: bytes = b"torch._utils\n_rebuild_tensor_v2\n") -> bytes:  # fmt: skip
    """torch.save's data.pkl for a contiguous tensor of `shape` over storage `key`."""
    numel = 1
    for n in shape:
        numel *= n
    stride = tuple(_strides(shape))
    return b"".join([
        pickle.PROTO + b"\x02", pickle.GLOBAL + rebuild, pickle.MARK,
        pickle.MARK, _text("storage"), pickle.GLOBAL + f"torch\n{dtype}Storage\n".encode(), _text(key), _text("cpu"),
        _int(numel if storage_numel is None else storage_numel), pickle.TUPLE, pickle.BINPERSID,
        _int(0), _tuple(shape), _tuple(stride), pickle.NEWFALSE,
        pickle.GLOBAL + b"collections\nOrderedDict\n", pickle.EMPTY_TUPLE, pickle.REDUCE,
        pickle.TUPLE, pickle.REDUCE, pickle.STOP,
    ])  # fmt: skip


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides: list[int] = []
    step = 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= max(n, 1)
    return strides


def archive(members: list[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED, comment: bytes = b"",
            deflated: tuple[str, ...] = ()) -> bytes:  # fmt: skip
    """A zip of `members` in order (a name given twice is written twice, and zipfile warns), with `comment` after its
    end record; the members named in `deflated` are, whatever `compression` says."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as z:
        for name, data in members:
            z.writestr(name, data, zipfile.ZIP_DEFLATED if name in deflated else None)
        z.comment = comment
    return buffer.getvalue()


def members(shape: tuple[int, ...], dtype: str = "Float", fill: int = 0, data_pkl: bytes | None = None,
            folder: str = "archive") -> list[tuple[str, bytes]]:  # fmt: skip
    """torch.save's members for a tensor of `shape`, in its order, its values all the byte `fill` (0: zeros)."""
    numel = 1
    for n in shape:
        numel *= n
    return [(f"{folder}/{name}", data) for name, data in [
        ("data.pkl", tensor_pickle(shape, dtype) if data_pkl is None else data_pkl),
        (".format_version", b"1"), (".storage_alignment", b"64"), ("byteorder", b"little"),
        ("data/0", bytes([fill]) * numel * ITEM_BYTES[dtype]), ("version", b"3\n"),
        (".data/serialization_id", b"0" * 40),
    ]]  # fmt: skip


def saved(shape: tuple[int, ...], dtype: str = "Float", fill: int = 0, data_pkl: bytes | None = None) -> bytes:
    """torch.save(tensor) of `shape`, its values all the byte `fill` (0: zeros)."""
    return archive(members(shape, dtype, fill, data_pkl))


def without_zip64(raw: bytes) -> bytes:
    """torch.save's archive with its zip64 end record and locator taken out: the classic end record, which torch
    writes whole beside them, says the same."""
    end = len(raw) - 22
    assert raw[end - LOCATOR : end - LOCATOR + 4] == b"PK\x06\x07", "no zip64 locator before the end record"
    (at,) = struct.unpack_from("<Q", raw, end - LOCATOR + 8)
    assert at + END64 == end - LOCATOR and raw[at : at + 4] == b"PK\x06\x06", "a zip64 end record of its own size"
    return raw[:at] + raw[end:]


def embeds(shape: tuple[int, ...], dtype: str = "Float", fill: int = 0) -> str:
    """What a client sends as one `prompt_embeds` entry."""
    return base64.b64encode(saved(shape, dtype, fill)).decode()
