"""Reading prompt_embeds: each tensor's num_tokens from its data.pkl, as vLLM will run it, and a clear 400 for
anything the guard cannot count; nothing is unpickled (a pickle naming another callable is refused, never called)."""

from __future__ import annotations

import base64
import pickle
import struct

import pytest

from proxy.api.embeds import MAX_PROMPTS, embeds_lengths
from proxy.errors import InvalidRequest
from tests.support.torch_save import embeds, saved, tensor_pickle


def sent(data_pkl: bytes) -> str:
    return base64.b64encode(saved((2, 4), data_pkl=data_pkl)).decode()


def refused(value: object) -> str:
    with pytest.raises(InvalidRequest) as info:
        embeds_lengths(value)
    assert info.value.param == "prompt_embeds" and info.value.status == 400
    return info.value.message


@pytest.mark.parametrize(
    "shapes,lengths",
    [([(5, 64)], [5]), ([(1, 7, 64)], [7]), ([(3, 8), (1, 300, 8), (0, 8)], [3, 300, 0])],
)
def test_each_tensor_counts_its_rows(shapes: list[tuple[int, ...]], lengths: list[int]) -> None:
    assert embeds_lengths([embeds(s) for s in shapes]) == lengths


def test_one_tensor_alone_and_no_tensors() -> None:
    assert embeds_lengths(embeds((9, 16), "BFloat16")) == [9]
    assert embeds_lengths(None) == [] and embeds_lengths([]) == []


@pytest.mark.parametrize("shape", [(16,), (2, 3, 16), (1, 1, 3, 16), ()])
def test_shapes_vllm_refuses_are_refused(shape: tuple[int, ...]) -> None:
    assert "vLLM takes (num_tokens, hidden_size)" in refused(embeds(shape))


def test_entries_that_are_not_text() -> None:
    assert "'prompt_embeds[1]' must be base64 text" in refused([embeds((1, 4)), [1, 2]])
    assert "'prompt_embeds' must be base64 text" in refused(5)


def test_no_more_tensors_than_vllm_takes() -> None:
    assert f"exceeds the maximum allowed count of {MAX_PROMPTS}" in refused(["x"] * (MAX_PROMPTS + 1))


@pytest.mark.parametrize(
    "rebuild",
    [
        b"torch._utils\n_rebuild_sparse_tensor\n",
        b"torch._utils\n_rebuild_parameter\n",
        b"builtins\neval\n",
        b"os\nsystem\n",
    ],
)
def test_a_pickle_naming_another_callable_is_refused_not_called(rebuild: bytes) -> None:
    assert "other than a plain dense tensor" in refused(sent(tensor_pickle((2, 4), rebuild=rebuild)))


def test_opcodes_a_tensor_does_not_use_are_refused() -> None:
    assert "opcode a tensor's pickle does not use (EMPTY_DICT)" in refused(sent(pickle.dumps({"a": 1}, protocol=2)))
    assert "not a pickle torch.save writes" in refused(sent(b"\x80\x02K\x01K\x02."))  # two values left
    assert "not a pickle torch.save writes" in refused(sent(b"\x80\x02\xff"))
    assert "not a pickle torch.save writes" in refused(sent(tensor_pickle((2, 4))[:-1]))


def test_a_pickle_that_would_build_exponentially_is_read_in_one_pass() -> None:
    # each level is a tuple of the previous one twice: unpickled naively, 2**30 leaves
    laughs = pickle.PROTO + b"\x02" + pickle.BININT1 + b"\x00" + pickle.BINPUT + b"\x00"
    for _ in range(30):
        laughs += pickle.BINGET + b"\x00" + pickle.TUPLE2 + pickle.BINPUT + b"\x00"
    assert "other than a plain dense tensor" in refused(sent(laughs + pickle.STOP))


def test_a_pickle_longer_than_a_tensors_is_refused_unread() -> None:
    assert "more than 128 opcodes" in refused(sent(pickle.PROTO + b"\x02" + pickle.NONE * 200 + pickle.STOP))
    assert "a tensor's takes a few hundred" in refused(sent(pickle.PROTO + b"\x02" + pickle.NONE * 5000 + pickle.STOP))


def test_a_size_that_is_not_counts_is_refused() -> None:
    two, minus_two = pickle.BININT + struct.pack("<i", 2), pickle.BININT + struct.pack("<i", -2)
    negative = tensor_pickle((2, 4)).replace(two, minus_two)
    assert "other than a plain dense tensor" in refused(sent(negative))
