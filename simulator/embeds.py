"""`prompt_embeds` on /v1/completions as vLLM 0.31 / 0.32 load them (`renderers/embed_utils.py`,
`safe_load_prompt_embeds`): strict base64, `torch.load(weights_only=True)`, a batch of one squeezed, a 2-D
(num_tokens, hidden_size) tensor of a floating dtype and the model's hidden size; refused unless the server was
started with `--enable-prompt-embeds`.

torch is not installed here: the archive is opened with zipfile (the folder is its first entry's, as torch takes it)
and data.pkl loaded by an unpickler that resolves only the four names a dense tensor's pickle uses, the way torch's
weights_only unpickler allows only known names. This is the simulator's own reading, written apart from the guard's
opcode reader (proxy/api/embeds.py), so that the two can disagree in a test.
"""

from __future__ import annotations

import binascii
import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from simulator.errors import ApiError, validation_error

NOT_ENABLED = "You must set `--enable-prompt-embeds` to input `prompt_embeds`."
MAX_PROMPTS = 1024  # VLLM_MAX_COMPLETION_PROMPTS
FLOATING = {"FloatStorage": "torch.float32", "BFloat16Storage": "torch.bfloat16", "HalfStorage": "torch.float16",
            "DoubleStorage": "torch.float64"}  # fmt: skip


@dataclass(frozen=True)
class Storage:
    name: str  # torch's storage class, FloatStorage, LongStorage, ...


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    storage: str


def _rebuild_tensor_v2(storage: Any, offset: int, size: tuple[int, ...], *rest: Any) -> Tensor:
    return Tensor(tuple(size), storage[1].name)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return Storage(name)
        raise pickle.UnpicklingError(f"Weights only load failed: unsupported global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid


def embeds_rows(value: Any, enabled: bool, hidden_size: int) -> list[int]:
    """Each tensor's num_tokens, in order; [] without embeds."""
    if value is None:
        return []
    tensors = value if isinstance(value, list) else [value]
    if len(tensors) > MAX_PROMPTS:
        raise validation_error(f"prompt_embeds list length {len(tensors)} exceeds the maximum allowed count of "
                               f"{MAX_PROMPTS}. To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS "
                               "environment variable.", parameter="prompt_embeds")  # fmt: skip
    if not all(isinstance(t, str) for t in tensors):
        raise ApiError("Input should be a valid bytes", param="prompt_embeds")
    if tensors and not enabled:
        raise validation_error(NOT_ENABLED, parameter="prompt_embeds")
    return [_rows(_loaded(t), hidden_size) for t in tensors]


def _loaded(text: str) -> Tensor:
    try:
        payload = binascii.a2b_base64(text.encode(), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ApiError(str(exc)) from None
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            folder = archive.namelist()[0].partition("/")[0]
            loaded = _Unpickler(io.BytesIO(archive.read(f"{folder}/data.pkl"))).load()
    except Exception as exc:
        raise validation_error(f"`prompt_embeds` could not be deserialized as a torch tensor: {exc}"[:300],
                               parameter="prompt_embeds") from None  # fmt: skip
    if not isinstance(loaded, Tensor):
        raise validation_error("`prompt_embeds` could not be deserialized as a torch tensor", parameter="prompt_embeds")
    return loaded


def _rows(tensor: Tensor, hidden_size: int) -> int:
    shape = tensor.shape[1:] if len(tensor.shape) > 2 and tensor.shape[0] == 1 else tensor.shape
    if len(shape) != 2:
        raise validation_error("`prompt_embeds` must be a 2D tensor of shape (num_tokens, hidden_size); got shape "
                               f"{shape}.", parameter="prompt_embeds")  # fmt: skip
    if shape[1] != hidden_size:
        raise validation_error(f"`prompt_embeds` hidden_size {shape[1]} does not match the model's hidden_size "
                               f"{hidden_size}.", parameter="prompt_embeds")  # fmt: skip
    if tensor.storage not in FLOATING:
        raise validation_error(f"`prompt_embeds` dtype {tensor.storage} is not a floating-point type, cannot safely "
                               "cast to the model's dtype.", parameter="prompt_embeds")  # fmt: skip
    return shape[0]
