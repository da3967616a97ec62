"""The test process's own children, as scenarios check for the rank server."""

import os


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def forkservers_of(pid):
    found = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in command:
            found.append(child)
    return found
