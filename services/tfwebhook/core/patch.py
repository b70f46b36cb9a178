"""RFC 6902 JSON Patch as one diff between two JSON documents. Pure: no I/O.

Objects are diffed key by key (removals, then additions and replacements, in a stable order); arrays of
equal length element by element, otherwise replaced whole. The output applied to `before` gives `after`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

JsonPatch = list[dict[str, Any]]


def escape_pointer_token(token: str) -> str:
    if "~" not in token and "/" not in token:
        return token
    return _escaped(token)


@lru_cache(maxsize=4096)
def _escaped(token: str) -> str:
    """`token` with `~` and `/` escaped; remembered, since a cluster's label and annotation keys repeat."""
    return token.replace("~", "~0").replace("/", "~1")


def json_diff(before: Any, after: Any) -> JsonPatch:
    """The operations that turn `before` into `after`; empty when they are equal."""
    operations: JsonPatch = []
    _diff(before, after, "", operations)
    return operations


def _diff(before: Any, after: Any, path: str, operations: JsonPatch) -> None:
    if before is after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            if key not in after:
                operations.append({"op": "remove", "path": f"{path}/{escape_pointer_token(key)}"})
        for key, value in after.items():
            if key not in before:
                operations.append(
                    {"op": "add", "path": f"{path}/{escape_pointer_token(key)}", "value": value}
                )
                continue
            old = before[key]
            if old is value or (type(old) is type(value) and type(value) is str and old == value):
                continue
            _diff(old, value, f"{path}/{escape_pointer_token(key)}", operations)
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            _diff(old, new, f"{path}/{index}", operations)
        return
    if type(before) is not type(after) or before != after:
        operations.append({"op": "replace", "path": path, "value": after})
