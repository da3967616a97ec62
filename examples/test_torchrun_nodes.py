"""Two torchrun agents on this machine act as two nodes and run examples/torchrun_nodes.py.

A static rendezvous on loopback; each agent runs one rank. Each node reports
its own results, and both must pass.
"""

import subprocess
import sys
from pathlib import Path

from distspawn import find_free_port

SUITE = Path(__file__).with_name("torchrun_nodes.py")


def test_two_nodes_on_loopback():
    port = str(find_free_port())
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", "127.0.0.1",
             "--master-port", port, "--rdzv-backend", "static", str(SUITE)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)
    ]
    outputs = []
    try:
        outputs = [agent.communicate(timeout=180)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    for node, (agent, output) in enumerate(zip(agents, outputs)):
        assert agent.returncode == 0, output
        assert f"node {node} rank {node} of 2" in output, output
        assert "Ran 2 tests" in output and "OK" in output, output
