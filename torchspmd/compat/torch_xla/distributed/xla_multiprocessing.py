"""``torch_xla.distributed.xla_multiprocessing``: no process per device under SPMD."""

from torchspmd.compat.errors import refusing

spawn = refusing("xmp.spawn", "SPMD runs one process per host: call the function directly, "
                 "or start several hosts' processes with torchrun (docs/guides/multiprocess.md)")
