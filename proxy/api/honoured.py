"""Request headers vLLM 0.31 / 0.32 act on besides the body, and what the guard sends upstream of them on a guarded
route (docs/endpoints.md, "What vLLM reads besides the body", lists every side input and what the guard does).

    X-Amzn-SageMaker-Adapter-Identifier  on /invocations, model_hosting_container_standards' inject_adapter_id sets
                                         the body's `model` to its value (to null without it): the guard reads the
                                         model from it (api/invocations.py) and pins it to the one value it checked
                                         (Envoy forwards a repeated header whole, and Starlette reads the first)
    X-data-parallel-rank                 sends the request to one data-parallel engine of the replica: stripped, the
                                         client does not choose where its request runs (a router after the guard may)
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.api.routes import Reads

ADAPTER = "x-amzn-sagemaker-adapter-identifier"
DP_RANK = "x-data-parallel-rank"
STRIPPED = (DP_RANK,)


def header_changes(reads: str | None, headers: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The headers to set on a guarded request going upstream (each replacing every value of its name), and the
    names to take off; `headers` as the guard read them (names in lower case, one value each)."""
    pinned = {ADAPTER: headers[ADAPTER]} if reads == Reads.INVOCATIONS and ADAPTER in headers else {}
    return pinned, tuple(name for name in STRIPPED if name in headers)


def for_upstream(reads: str | None, headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the changes applied (the HTTP front end, which forwards one value of each header); `headers`
    itself when there are none, the usual case."""
    pinned, stripped = header_changes(reads, headers)
    if not pinned and not stripped:
        return headers
    return {**{k: v for k, v in headers.items() if k not in stripped}, **pinned}
