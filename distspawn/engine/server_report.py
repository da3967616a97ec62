"""The rank server's report, checked field by field before the test process acts on it.

The report comes over the hand-over's socket (``distspawn.early.rank_server_boot``),
which only the server this process started can reach. It is checked all the
same, as data from another process: a report of the wrong shape is refused
whole (the run then starts ranks afresh, and says why), and a folder it names
for removal is watched only where it is one torch makes at import: a
``tempfile.mkdtemp`` folder directly in the temp folder, this user's, that no
one else can enter. A path that fails any of that is never removed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from typing import Any

__all__ = ["MalformedReport", "parse_report", "exit_folder_refusal"]

# What tempfile.mkdtemp() names a folder (torch 2.8's template folder is one).
_MKDTEMP_NAME = re.compile(r"tmp[a-z0-9_]{8}")


class MalformedReport(ValueError):
    """The server's report is not of the shape it sends (the text says where)."""


def _is_record(value: Any) -> bool:
    # variable -> [its value when first read, its value after] (None: unset)
    return isinstance(value, dict) and all(
        isinstance(key, str) and isinstance(pair, list) and len(pair) == 2
        and all(v is None or isinstance(v, str) for v in pair)
        for key, pair in value.items())


def _is_text_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items())


# Every field the server sends, and what each must be.
_FIELDS = {
    "preload": _is_record,
    "preload_failures": _is_text_map,
    "modules": lambda value: isinstance(value, dict) and all(
        isinstance(name, str) and _is_record(record) for name, record in value.items()),
    "refused": _is_text_map,
    "switch": lambda value: isinstance(value, bool),
    "exit_folders": lambda value: isinstance(value, list) and all(
        isinstance(path, str) for path in value),
}


def parse_report(data: bytes) -> dict[str, Any]:
    """The report in ``data`` (one JSON line), checked: every field the server
    sends, of its type, and no other. Raises :class:`MalformedReport`.

    >>> parse_report(b'{"switch": true, "exit_folders": [], "preload": {}, "refused": {},'
    ...              b' "preload_failures": {}}')
    Traceback (most recent call last):
    ...
    distspawn.engine.server_report.MalformedReport: fields missing: modules
    """
    try:
        report = json.loads(data)
    except ValueError as e:
        raise MalformedReport(f"not JSON ({e})") from None
    if not isinstance(report, dict):
        raise MalformedReport(f"a {type(report).__name__}, not an object")
    unknown = sorted(set(report) - set(_FIELDS))
    if unknown:
        raise MalformedReport(f"unknown fields: {', '.join(map(repr, unknown[:5]))}")
    missing = sorted(set(_FIELDS) - set(report))
    if missing:
        raise MalformedReport(f"fields missing: {', '.join(missing)}")
    for name, valid in _FIELDS.items():
        if not valid(report[name]):
            raise MalformedReport(f"field {name!r} is not of its type: "
                                  f"{json.dumps(report[name])[:80]}")
    return report


def exit_folder_refusal(path: str) -> str | None:
    """Why ``path`` must not be removed on the server's word (None: it may be).

    It may where torch could have made it at import: a folder that
    ``tempfile.mkdtemp`` names, directly in the temp folder, owned by this
    user and closed to everyone else, not a link.
    """
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        return "not an absolute, normal path"
    if not _MKDTEMP_NAME.fullmatch(os.path.basename(path)):
        return "not a name tempfile.mkdtemp gives"
    if os.path.realpath(os.path.dirname(path)) != os.path.realpath(tempfile.gettempdir()):
        return f"not directly in the temp folder {tempfile.gettempdir()}"
    try:
        info = os.lstat(path)
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not this user"
    if info.st_mode & 0o077:
        return f"open to others (mode {stat.S_IMODE(info.st_mode):o})"
    return None
