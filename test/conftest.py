import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
collect_ignore = ["scenarios"]
if "BACKEND" not in os.environ:
    # The conformance entry file is configured by BACKEND / WORLD_SIZE / TEMP_DIR;
    # test_dist_backend.py runs it in subprocesses with them set.
    collect_ignore.append("test_distributed_spawn.py")
