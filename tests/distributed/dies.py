"""One of two processes is killed mid-run; the other must stop with an error, not hang.

    python dies.py COORDINATOR_PORT RANK READ_MARKER

Started without a launcher, through ``torchspmd.distributed.initialize`` (and
``torch.distributed`` beside it, as checkpoints need). Process 1 is killed after the
first collective, once process 0 has finished it too (READ_MARKER, a file process 0
creates, says so: killed any earlier, process 1 can cut process 0's first read short);
process 0 goes on reading sharded values (each read a collective that process 1 will
never join).
"""

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed

import torchspmd
import torchspmd.distributed

port, rank, marker = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
torchspmd.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                                 heartbeat_timeout_s=5)
torchspmd.distributed.init_torch_distributed()  # gloo store on the coordinator's port + 1
torch.distributed.barrier()
mesh = torchspmd.Mesh(np.arange(8), (8,), ("x",))
x = torch.arange(64.).to(torchspmd.device())
torchspmd.mark_sharding(x, mesh, ("x",))
print(f"process {rank} read {(x * 2).cpu().sum().item()}", flush=True)
if rank == 0:
    marker.touch()
if rank == 1:
    while not marker.exists():  # the test's launch timeout bounds this wait
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    x = x + 1
    (x * 2).cpu()
