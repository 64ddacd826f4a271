"""Tensors torch.save itself writes, for request bodies the differential test sends (tests/e2e/reading.py): torch is
only in the vLLM environments, so each `Tensor` is written there, all of them by one process, when a test first needs
them; a body holds `Tensor.MARK` with the tensor's index where its base64 text goes."""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import dataclass

from tests.e2e.runtime import VERSIONS, quiet_env, vllm_venv
from tests.support.torch_save import without_zip64

SAVE = """
import base64, io, json, sys, torch
for line in sys.stdin:
    tensor = json.loads(line)
    out = io.BytesIO()
    torch.save(eval(tensor["expression"], {"torch": torch}), out, _use_new_zipfile_serialization=not tensor["legacy"])
    print(base64.b64encode(out.getvalue()).decode(), flush=True)
"""


@dataclass(frozen=True)
class Tensor:
    expression: str  # what torch.save is given, e.g. "torch.zeros(3, 128)"
    legacy: bool = False  # torch's format before its zip (`_use_new_zipfile_serialization=False`)
    zip64: bool = True  # False: torch's archive with its zip64 end record and locator taken out

    MARK = "@tensor{}@"


def saved(tensors: list[Tensor]) -> list[str]:
    """Each tensor's base64 text, as a client sends it in `prompt_embeds`."""
    if not tensors:
        return []
    python = vllm_venv(min(VERSIONS)) / "bin" / "python"  # torch is pinned alike in both (runtime.TORCH_PIN)
    lines = "".join(json.dumps({"expression": t.expression, "legacy": t.legacy}) + "\n" for t in tensors)
    done = subprocess.run([str(python), "-c", SAVE], input=lines, capture_output=True, text=True, timeout=300,
                          env=quiet_env(), check=True)  # fmt: skip
    written = [base64.b64decode(line) for line in done.stdout.split()]
    kept = [raw if t.zip64 else without_zip64(raw) for t, raw in zip(tensors, written, strict=True)]
    return [base64.b64encode(raw).decode() for raw in kept]
