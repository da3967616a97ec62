"""Put on PYTHONPATH by test_warm_ranks: every interpreter started with it,
the rank server's among them, makes a temporary folder as it starts, to
write into later (torch 2.8 makes one so as torch.distributed.nn is imported,
and writes the RemoteModule code it generates there)."""

import tempfile

FOLDER = tempfile.TemporaryDirectory(prefix="distspawn-made-at-start-")
