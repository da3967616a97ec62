"""Prints what a process can see of how it was started, as one JSON line:
test_warm_python compares a run forked from the warm interpreter with a
fresh one. Exits with the status its first argument names."""

import json
import multiprocessing
import multiprocessing.process
import os
import random
import sys
import tempfile

import __main__

code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "path": sys.path[1:],
    "cwd": os.getcwd(),
    "multiprocessing_cwd": multiprocessing.process.ORIGINAL_DIR,
    "main_file": getattr(__main__, "__file__", None),
    "main_name": __name__,
    "tmp": tempfile.gettempdir(),
    "probe_var": os.environ.get("PROBE_VAR"),
    "c_level_var": os.popen("echo $PROBE_VAR").read().strip(),
    "stdin": sys.stdin.read(),
    "stdout_tty": sys.stdout.isatty(),
    "flags": list(sys.flags),
    "parent_process": multiprocessing.parent_process() is None,
    "random": random.random(),
    "authkey": multiprocessing.current_process().authkey.hex(),
}, sort_keys=True))
print("to stderr", file=sys.stderr)
sys.exit(code)
