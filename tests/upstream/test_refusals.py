"""Each refusal the guard skips a replica for is vLLM's own text, sent from the release the table names and not
before (read in vLLM's sources: 0.31 and 0.32 as installed for `make e2e`, 0.33 and 0.34 from their released
wheels; a release whose source is not on the machine is skipped)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxy.upstream.refusals import REFUSALS, Refusal

CACHE = Path("/root/.cache/token-guard")
SOURCES = {
    "0.31": CACHE / "vllm-0.31.0/lib/python3.11/site-packages/vllm",
    "0.32": CACHE / "vllm-0.32.0/lib/python3.11/site-packages/vllm",
    "0.33": CACHE / "wheels/src-0.33.0/vllm",
    "0.34": CACHE / "wheels/src-0.34.0/vllm",
}
RELEASES = list(SOURCES)


def says(release: str, marker: bytes) -> bool:
    source = SOURCES[release]
    if not source.is_dir():
        pytest.skip(f"vLLM {release}'s source is not on this machine ({source})")
    found = subprocess.run(["grep", "-rqF", "--include=*.py", marker.decode(), str(source)], check=False)
    return found.returncode == 0


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r.code + " " + r.marker.decode()[:24] for r in REFUSALS])
def test_the_refusal_is_vllms_from_its_first_release(refusal: Refusal) -> None:
    first = RELEASES.index(refusal.since)
    assert all(says(release, refusal.marker) for release in RELEASES[first:])
    assert not any(says(release, refusal.marker) for release in RELEASES[:first])
