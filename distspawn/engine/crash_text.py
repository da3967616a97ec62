"""Reading what a crashed rank left behind, so a report leads with the crash.

A rank that dies by a fatal signal leaves two things: the Python stack that
``faulthandler`` wrote to the rank's crash file, and in its output whatever
native handlers printed (torch prints every thread's native frames, dozens
of lines that push the rank's own last lines out of a tail). These helpers
pull the two apart: the user's output stays the tail, the native dump is
kept short and shown after it.
"""

from __future__ import annotations

import re

# Where a native handler's dump starts ("SIGSEGV(11), PID: 12, Thread 12:")
# and what its lines look like; both are torch's c10 FatalSignalHandler's.
_DUMP_HEADER = re.compile(r"^[A-Z]+\(\d+\), PID: \d+, Thread \d+:\s*$")
_DUMP_LINE = re.compile(r"^\s*(frame #\d+: |<omitting python frames>)")
NATIVE_FRAMES_SHOWN = 8


def split_native_dump(lines: list[str]) -> tuple[list[str], list[str]]:
    """``lines`` as (the rank's own output, native dump lines), each in order."""
    own: list[str] = []
    native: list[str] = []
    in_dump = False
    for line in lines:
        if _DUMP_HEADER.match(line):
            in_dump = True
            native.append(line)
        elif in_dump and (_DUMP_LINE.match(line) or not line.strip()):
            native.append(line)
        else:
            in_dump = False
            own.append(line)
    return own, native


def trim_native_dump(native: list[str]) -> list[str]:
    """The first thread's dump cut to a few frames, then what was left out."""
    if not native:
        return []
    blocks: list[list[str]] = []
    for line in native:
        if _DUMP_HEADER.match(line):
            blocks.append([line])
        elif blocks and line.strip():
            blocks[-1].append(line)
    if not blocks:
        return []
    first = blocks[0]
    shown = first[: 1 + NATIVE_FRAMES_SHOWN]
    hidden = len(first) - len(shown)
    if hidden > 0:
        shown.append(f"({hidden} more native frame(s) left out)")
    if len(blocks) > 1:
        shown.append(f"(native stacks of {len(blocks) - 1} other thread(s) left out)")
    return shown


_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line')


def drop_frames(text: str, hide_frame) -> str:
    """faulthandler's stacks without the frames ``hide_frame(path)`` marks.

    A thread whose every frame is marked (a harness thread) keeps them all:
    it is still shown, as what it is.
    """
    out: list[str] = []
    block: list[str] = []  # one thread's consecutive frame lines

    def flush() -> None:
        kept = [line for line in block if not hide_frame(_FRAME.match(line).group("path"))]
        out.extend(kept or block)
        block.clear()

    for line in text.splitlines():
        if not _FRAME.match(line):
            flush()
            out.append(line)
        else:
            block.append(line)
    flush()
    return "\n".join(out)


def python_crash_stack(text: str, hide_frame=lambda path: False) -> str | None:
    """The crashing thread's Python stack from faulthandler's report.

    faulthandler lists every thread, the crashing one ("Current thread") in
    thread order among them; that one comes first here, without the frames
    ``hide_frame(path)`` marks as the harness's, and the others are counted.
    """
    lines = [line for line in drop_frames(text, hide_frame).splitlines()
             if not line.startswith("Extension modules:")]
    if not any(line.strip() for line in lines):
        return None
    title = lines[0] if lines[0].startswith("Fatal Python error") else None
    blocks: list[list[str]] = []
    for line in lines[1 if title else 0:]:
        if line.startswith(("Current thread", "Thread ")):
            blocks.append([line])
        elif blocks and line.strip():
            blocks[-1].append(line)
    crashing = next((b for b in blocks if b[0].startswith("Current thread")), None)
    if crashing is None:
        return "\n".join(lines).strip()
    shown = ([title] if title else []) + crashing
    others = len(blocks) - 1
    if others:
        shown.append(f"({others} other thread(s) not shown)")
    return "\n".join(shown)
