"""Rank side of stall diagnosis: each rank's recent collectives, kept where the parent reads them.

torch's flight recorder (c10d) keeps a ring of every collective a process
group issues: its group, sequence number, op, sizes, dtypes and whether it
has retired. A rank turns it on for gloo and nccl by environment variable
before its first group exists (``TORCH_FR_BUFFER_SIZE``; a value the user
set is kept), and :func:`tick`, called every :data:`HEARTBEAT_S` by a thread
the rank has anyway (a fresh rank's event listener, which upstream's ranks
have too: tests that count a rank's threads count the same), copies a compact
summary into the rank's ``.collectives`` file when the calls waiting change,
and touches it otherwise, so the parent can tell a blocked rank from one
whose thread has not run. Reused workers, which have no such thread, get one
of their own. The rank writes a last summary when its test ends. Turning the
log on also has the rank keep the reduce op of each call that takes one
(``engine.reduce_ops``), which its report carries, and note the blocking
store call its main thread is in (``engine.store_waits``), which the log
carries beside the collectives.

The recorder's dump is private (``torch._C._distributed_c10d``, listed in
``distspawn.private_apis``). Where it is missing nothing is recorded and stalls
are judged at the deadline only, as upstream does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from . import reduce_ops, store_waits

# Entries the recorder keeps per process (upstream's default is 0: off).
BUFFER_ENTRIES = "64"
# One variable for gloo and nccl (nccl's older TORCH_NCCL_TRACE_BUFFER_SIZE
# is deprecated in its favour and warns).
BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE",)
HEARTBEAT_S = 0.25
# How many retired calls a summary keeps besides the waiting ones (for reports).
RECENT = 4
# Set to 0 in a rank's environment to leave the recorder as the user has it.
RECORD_VARIABLE = "DISTSPAWN_RECORD_COLLECTIVES"

_writer: _LogWriter | None = None


def _dumpers() -> list[Any]:
    """The recorder dumps this torch has, gloo's (CPU) first."""
    try:
        import torch._C._distributed_c10d as c10d_ext
    except ImportError:
        return []
    found = []
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        dump = getattr(c10d_ext, name, None)  # private: listed in distspawn.private_apis
        if dump is not None:
            found.append(dump)
    return found


def recording_wanted() -> bool:
    return os.environ.get(RECORD_VARIABLE, "1") != "0"


def start_recording(path: str | None, own_thread: bool = False) -> None:
    """Turn the recorder on in this rank and keep ``path`` up to date (idempotent).

    Called before the rank's first process group is made: the recorder reads
    its buffer size when a group is created. ``own_thread``: no thread of the
    rank calls :func:`tick`; start one that does.
    """
    global _writer
    if path is None or not recording_wanted() or not _dumpers():
        return
    for variable in BUFFER_VARIABLES:
        os.environ.setdefault(variable, BUFFER_ENTRIES)
    reduce_ops.install()
    store_waits.install()
    if _writer is None or _writer.path != path:
        _writer = _LogWriter(path)
        if own_thread:
            threading.Thread(target=_tick_forever, name="distspawn collective log",
                             daemon=True).start()


def tick() -> None:
    """Bring the log up to date (or show this rank's threads still run)."""
    _write(final=False)


def write_final_summary() -> None:
    """The rank's test has ended: write what it last did (read by the parent)."""
    _write(final=True)


def _write(final: bool) -> None:
    if _writer is not None:
        try:
            _writer.write(final=final)
        except Exception:  # noqa: BLE001 - diagnosis must never break a rank
            pass


def _tick_forever() -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        tick()


def summary(only_waiting: bool = False) -> dict[str, Any] | None:
    """This process's recorded calls, compact: None when nothing was recorded."""
    groups: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for dump in _dumpers():
        try:
            raw = json.loads(dump(True, only_waiting))
        except Exception:  # noqa: BLE001 - a recorder that cannot dump: nothing to say
            continue
        for status_name, status in (raw.get("pg_status") or {}).items():
            groups.setdefault(status_name, {})["completed"] = _int(
                status.get("last_completed_collective"))
        for raw_entry in raw.get("entries") or ():
            entry = _entry(raw_entry)
            # Where gloo's and nccl's dumps read one recorder, keep each call once.
            key = (entry["order"], entry["group"], entry["seq"], entry["op"])
            if key not in seen:
                seen.add(key)
                entries.append(entry)
    if not entries and not groups:
        return None
    for name, ranks in _group_members().items():
        groups.setdefault(name, {})["ranks"] = ranks
    waiting = [e for e in entries if not e["retired"]]
    retired = [e for e in entries if e["retired"]][-RECENT:]
    return {"groups": groups, "calls": sorted(retired + waiting, key=lambda e: e["order"])}


def _group_members() -> dict[str, list[int]]:
    """Each live group's global ranks, by the name the recorder gives it.

    (The recorder's own ``pg_config`` is filled in by nccl only.)
    """
    dist = sys.modules.get("torch.distributed")
    world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    names = getattr(world, "pg_names", None)  # private: listed in distspawn.private_apis
    if not names:
        return {}
    members = {}
    try:
        for group, name in list(names.items()):
            members[str(name)] = list(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - a group torn down meanwhile: say what we have
        pass
    return members


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    group = raw.get("process_group") or ["", ""]
    name = raw.get("profiling_name", "")
    return {
        "order": raw.get("record_id", 0),
        "group": str(group[0]),
        "group_desc": str(group[1]) if len(group) > 1 else "",
        "seq": raw.get("p2p_seq_id") if raw.get("is_p2p") else raw.get("collective_seq_id"),
        "p2p": bool(raw.get("is_p2p")),
        "op": name.split(":", 1)[-1],
        "backend": name.split(":", 1)[0] if ":" in name else "",
        "sizes": raw.get("input_sizes") or [],
        "dtypes": raw.get("input_dtypes") or [],
        "out_sizes": raw.get("output_sizes") or [],
        "out_dtypes": raw.get("output_dtypes") or [],
        "retired": bool(raw.get("retired")),
        "created_ns": raw.get("time_created_ns", 0),
    }


# The recorder keeps neither a call's root nor its reduce op, and gloo's
# leaves out send and recv: the rank's main thread, found inside one of
# torch.distributed's own functions, says what it waits in and with what.
# gloo records neither; the stall judge reads them off the stack (engine.stall).
P2P_FUNCTIONS = ("send", "recv")
_C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")
_FRAMES_LOOKED_AT = 4  # from the innermost Python frame outwards
# Arguments worth keeping: which rank is the root, and how values combine.
_ROOT_ARGUMENTS = ("src", "dst", "group_src", "group_dst")


def _main_thread_c10d_call() -> tuple[int, str, dict[str, Any]] | None:
    """(frame id, function, {"root", "reduce_op"}) of the torch.distributed
    function the main thread is in, else None."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # private: listed
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_filename.endswith(_C10D_FILE) and not code.co_name.startswith("_"):
            return id(frame), code.co_name, _call_arguments(frame)
        frame = frame.f_back
    return None


def _call_arguments(frame: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        local = frame.f_locals
        for name in _ROOT_ARGUMENTS:
            if isinstance(local.get(name), int):
                found["root"] = local[name]
                break
        op = local.get("op")
        if op is not None and not isinstance(op, (str, int)):
            found["reduce_op"] = str(getattr(op, "name", op)).rsplit(".", 1)[-1]
    except Exception:  # noqa: BLE001 - a frame that cannot be read says nothing
        pass
    return found


class _LogWriter:
    """Copies the recorder's summary into the rank's file, on change and as a heartbeat."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._last_key: Any = None
        self._written = False
        # frame id, function, its arguments, first seen (ns)
        self._main: tuple[int, str, dict[str, Any], int] | None = None

    def _main_call(self) -> dict[str, Any] | None:
        found = _main_thread_c10d_call()
        if found is None:
            self._main = None
            return None
        if self._main is None or self._main[0] != found[0]:
            self._main = (*found, time.time_ns())
        _, function, arguments, since_ns = self._main
        return {"function": function, "since_ns": since_ns, **arguments}

    def write(self, final: bool = False) -> None:
        waiting = summary(only_waiting=True)
        main_call = None if final else self._main_call()
        in_p2p = main_call is not None and main_call["function"] in P2P_FUNCTIONS
        store_wait = None if final else store_waits.current()
        if waiting is None and not in_p2p and store_wait is None and not final:
            return
        key = (None if waiting is None else (
            [e["order"] for e in waiting["calls"]],
            sorted((name, g.get("completed")) for name, g in waiting["groups"].items())),
            main_call, store_wait and store_wait["since_ns"])
        if key == self._last_key and self._written and not final:
            os.utime(self.path)  # the heartbeat: this rank's thread still runs
            return
        if final:
            # Only the cheap part (which calls wait, how far each group got): a
            # whole dump costs about a millisecond and tests are short. The
            # thread still writes the whole summary if the rank lives on.
            found = waiting
        else:
            self._last_key = key
            found = summary()  # something changed: the recent retired calls too
        found = found or {"groups": {}, "calls": []}
        record = {"pid": os.getpid(), "written_ns": time.time_ns(), "final": final,
                  "main_call": main_call, "store_wait": store_wait, **found}
        temporary = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(temporary, "w") as f:
            json.dump(record, f)
        os.replace(temporary, self.path)
        self._written = True
