"""A pytest plugin (``-p intruder``): another process on the machine connects
to the rank server's hand-over before the server can, and tries what an
attacker would (INTRUDER_AS says who it is):

- ``other-user``: a process of another uid (``nobody``; the run must be root);
- ``stranger``: this user's, but no child of the test process (double fork);
- ``child``: the test process's own child, without the server's secret.

It greets with a made-up secret, sends a report naming INTRUDER_FOLDER for
removal, then reads all it is sent until the test process hangs up, and
writes what it got to INTRUDER_RESULT as JSON: ``{"connected": bool,
"received": bytes, "ended": why}``.
"""

import json
import os
import subprocess
import sys

import distspawn.early.rank_server_boot as distspawn_rank_server

_real_ensure_server_running = distspawn_rank_server.ensure_server_running

# Run in its own interpreter: argv is who, socket path, result file, folder.
_INTRUDE = r"""
import json, os, pwd, socket, sys
who, path, result_path, folder = sys.argv[1:]
result = open(result_path, "w")  # opened before giving up this user's rights
if who == "stranger" and os.fork():
    os._exit(0)  # its child goes on, parented to init: not the test process's
if who == "other-user":
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
outcome = {"connected": False, "received": 0, "ended": ""}
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    connection.connect(path)
    outcome["connected"] = True
except OSError as e:
    outcome["ended"] = f"connect: {type(e).__name__}"
print("ready", flush=True)
if outcome["connected"]:
    forged = {"preload": {}, "preload_failures": {}, "modules": {}, "refused": {},
              "switch": False, "exit_folders": [folder]}
    try:
        connection.sendall(json.dumps({"greeting": "0" * 32}).encode() + b"\n"
                           + json.dumps(forged).encode() + b"\n")
        connection.settimeout(120)
        while True:
            data = connection.recv(65536)
            if not data:
                outcome["ended"] = "hung up on"
                break
            outcome["received"] += len(data)
    except OSError as e:
        outcome["ended"] = f"{type(e).__name__}: {e}"
json.dump(outcome, result)
result.close()
"""


def _intrude_then_start(hand_over=None):
    socket_path = (hand_over or {}).get(distspawn_rank_server.LIST_SOCKET_VAR)
    if socket_path is not None:
        # Before the server starts: the intruder's connection is queued first.
        intruder = subprocess.Popen(
            [sys.executable, "-c", _INTRUDE, os.environ["INTRUDER_AS"], socket_path,
             os.environ["INTRUDER_RESULT"], os.environ["INTRUDER_FOLDER"]],
            stdout=subprocess.PIPE, text=True)
        assert intruder.stdout.readline() == "ready\n"
        if os.environ["INTRUDER_AS"] == "stranger":
            intruder.wait()  # the double fork's first process: its child goes on
    return _real_ensure_server_running(hand_over)


distspawn_rank_server.ensure_server_running = _intrude_then_start
