"""One of two processes dies mid-run; the other must stop with an error, not hang.

    python dies.py COORDINATOR_PORT RANK HOW      (HOW: "killed" or "raises")

Started without a launcher, through ``torchspmd.distributed.initialize``. Process 1
dies after the first collective; process 0 goes on reading sharded values (each read
a collective that process 1 will never join).
"""

import os
import signal
import sys

import numpy as np
import torch

import torchspmd
import torchspmd.distributed

port, rank, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torchspmd.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                                 heartbeat_timeout_s=5)
mesh = torchspmd.Mesh(np.arange(8), (8,), ("x",))
x = torch.arange(64.).to(torchspmd.device())
torchspmd.mark_sharding(x, mesh, ("x",))
print(f"process {rank} read {(x * 2).cpu().sum().item()}", flush=True)
if rank == 1:
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("process 1 fails")
while True:
    x = x + 1
    (x * 2).cpu()
