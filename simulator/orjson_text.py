"""JSON as orjson writes it (vLLM 0.33+'s create_json_response: /pooling, /v1/embeddings, Cohere's /v2/embed),
without orjson: compact like starlette's JSONResponse and UTF-8 as it is, but floats differ. Each prints the
shortest digits that read back, and orjson places the point by the decimal exponent E: a float (a tensor's
`tolist()`) is written plainly for -5 <= E < 16 and else as 1e-6 / 1e+16, where Python writes 1e-05; a float32
array (/v1/embeddings' ndarray, OPT_SERIALIZE_NUMPY) plainly for -6 <= E < 13, from float32's own shortest digits.
NaN and infinities are null."""

from __future__ import annotations

import json
import math
import struct
from typing import Any


class Float32s(list[float]):
    """A vector vLLM hands orjson as a float32 ndarray."""


def orjson_dumps(value: Any) -> bytes:
    return "".join(_parts(value, False)).encode()


def orjson_float(number: float) -> str:
    if not math.isfinite(number):
        return "null"
    digits, exponent = _digits(repr(abs(number)))
    return _placed(number, digits, exponent, -5, 16)


def orjson_float32(number: float) -> str:
    single = _single(number)
    if not math.isfinite(single):
        return "null"
    for precision in range(1, 10):  # float32's shortest digits: the fewest that read back as the same float32
        text = f"{abs(single):.{precision - 1}e}"
        if _single(float(text)) == abs(single):
            break
    digits, exponent = _digits(text)
    return _placed(single, digits, exponent, -6, 13)


def _single(number: float) -> float:
    packed: float = struct.unpack("<f", struct.pack("<f", number))[0]
    return packed


def _digits(text: str) -> tuple[str, int]:
    """The significant digits of a non-negative number's text and the decimal exponent of the first one."""
    mantissa, _, exp = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    exponent = int(exp or 0) + len(whole) - 1
    digits = (whole + fraction).lstrip("0")
    exponent -= len(whole + fraction) - len((whole + fraction).lstrip("0"))
    digits = digits.rstrip("0")
    return (digits, exponent) if digits else ("0", 0)


def _placed(number: float, digits: str, exponent: int, low: int, high: int) -> str:
    sign = "-" if math.copysign(1.0, number) < 0 else ""
    if low <= exponent < high:
        if exponent < 0:
            return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
        whole, fraction = digits[: exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1 :]
        return f"{sign}{whole}.{fraction or '0'}"
    point = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
    return f"{sign}{point}e{'+' if exponent > 0 else '-'}{abs(exponent)}"


def _parts(value: Any, single: bool) -> list[str]:
    if isinstance(value, float):
        return [orjson_float32(value) if single else orjson_float(value)]
    if isinstance(value, dict):
        items = [[_string(str(key)), ":", *_parts(item, False)] for key, item in value.items()]
        return ["{", *_joined(items), "}"]
    if isinstance(value, list | tuple):
        inner = isinstance(value, Float32s)
        return ["[", *_joined([_parts(item, inner) for item in value]), "]"]
    if isinstance(value, str):
        return [_string(value)]
    return [json.dumps(value)]  # int, bool, None


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _joined(parts: list[list[str]]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(parts):
        if i:
            out.append(",")
        out.extend(part)
    return out
