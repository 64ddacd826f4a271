"""Keys spelled more than one way, resolved in each source before the sources are merged (proxy/settings/loader.py):
renamed keys, whose old name still works; retired keys, accepted and ignored; and upstream.url / upstream.urls, two
keys for one setting. A source is its values by section and key, and where each came from ("section.key" -> origin).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ENV_PREFIX = "TOKEN_GUARD_"
# Keys that once existed and do nothing now: accepted with a warning, so that an older config still loads.
RETIRED = {
    "upstream.write_timeout_s": "it was never used (sending a request counts toward upstream.first_byte_timeout_s); "
    "the deadline for a client that stops reading the guard's answer is server.write_timeout_s",
}
# Keys that moved: the old name still works from a file, the environment or a flag, with a warning naming the new one.
RENAMED = {
    "admission.redis_url": "redis.url",
    "admission.redis_failure": "redis.failure",
    "admission.redis_timeout_ms": "redis.timeout_ms",
    "admission.redis_lease_s": "redis.lease_s",
    "admission.redis_block_share": "redis.block_share",
}
# upstream.url and upstream.urls are one setting, the replicas' URLs, under two keys: a source that gives either
# replaces what a lower source gave under the other; one source giving both means urls (an empty one says nothing).
URL_KEYS = ("upstream.url", "upstream.urls")

Values = dict[str, dict[str, Any]]
log = logging.getLogger("token_guard.settings")


def rename(values: Values, origins: dict[str, str], parse: Callable[[str, Any], Any]) -> None:
    """Each old key of RENAMED in this source moved to its new name, with a warning. ValueError when the source gives
    both names different values (as `parse`, the new key's check, reads them)."""
    for old, new in RENAMED.items():
        section, _, key = old.partition(".")
        if key not in values.get(section, {}):
            continue
        value, origin = values[section].pop(key), origins.pop(old)
        new_section, _, new_key = new.partition(".")
        if new in origins:
            if parse(new, value) != parse(new, values[new_section][new_key]):
                raise ValueError(  # the values unsaid: a Redis URL may hold a password
                    f"{new}: given twice with different values, as {spelled(new, origins[new])} and by its old "
                    f"name {old} (from {origin}); keep only {new}"
                )
        else:
            values.setdefault(new_section, {})[new_key] = value
            origins[new] = origin
        log.warning("%s (from %s) is now %s: the old name still works, but will not forever", old, origin,
                    spelled(new, origin))  # fmt: skip


def spelled(dotted: str, origin: str) -> str:
    """A key as the source it came from writes it: `[redis] url`, TOKEN_GUARD_REDIS_URL or --redis-url."""
    section, _, key = dotted.partition(".")
    if origin.startswith(ENV_PREFIX):
        return f"{dotted} ({ENV_PREFIX}{section.upper()}_{key.upper()})"
    if origin.startswith("--"):
        return f"{dotted} (--{section}-{key.replace('_', '-')})"
    return f"{dotted} ([{section}] {key})"


def without_retired(section: str, given: dict[str, Any], origins: Mapping[str, str]) -> dict[str, Any]:
    kept = {}
    for key, value in given.items():
        dotted = f"{section}.{key}"
        if dotted in RETIRED:
            log.warning("%s (from %s) is ignored: %s", dotted, origins[dotted], RETIRED[dotted])
        else:
            kept[key] = value
    return kept


def one_url_key(values: Values, origins: dict[str, str]) -> bool:
    """Leave at most one of upstream.url and upstream.urls in this source (urls when both), dropping an empty one;
    whether one is left."""
    upstream = values.get("upstream", {})
    forget(values, origins, [key for key in URL_KEYS if upstream.get(key.partition(".")[2], 0) in ("", [], ())])
    if all(key.partition(".")[2] in upstream for key in URL_KEYS):
        forget(values, origins, ["upstream.url"])
    return any(key.partition(".")[2] in upstream for key in URL_KEYS)


def replica_urls(parsed: dict[str, Any]) -> dict[str, Any]:
    """The upstream section with its URLs under `urls` whichever key gave them (at most one is left); none: the
    default."""
    urls = parsed.pop("url", ()) + parsed.pop("urls", ())
    return {**parsed, "urls": urls} if urls else parsed


def forget(values: Values, origins: dict[str, str], keys: Sequence[str]) -> None:
    for dotted in keys:
        section, _, key = dotted.partition(".")
        if values.get(section, {}).pop(key, None) is not None:
            origins.pop(dotted)
