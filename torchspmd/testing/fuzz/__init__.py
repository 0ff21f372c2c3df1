"""A differential fuzzer: random sharded programs, each compared with CPU eager PyTorch.

A program draws meshes (all devices or a sub-mesh, permuted orders, 1-3 dims), tensors
(uneven and size-1 dims; float32, int64, bfloat16), op chains (views, in-place writes,
reductions, matmuls, indexing, cat/softmax) and ``mark_sharding`` /
``annotate_custom_sharding`` / ``clear_sharding`` / ``sync()`` at random points. Each
program runs on CPU and on the spmd device; its outcome is ok, a wrong value, an internal
error (a JAX/XLA exception, a bare AssertionError/KeyError...), or a clear user error.
Everything is seeded: a failure is written out as a standalone repro script.

Command line: ``python -m torchspmd.testing.fuzz --programs 2000 --seed 0``. Example::

    >>> from torchspmd.testing.fuzz import generate, run_program
    >>> run_program(generate(seed=0, index=7)).kind
    'ok'
"""

from torchspmd.testing.fuzz.generator import Program, generate
from torchspmd.testing.fuzz.report import fuzz, repro_script, run_program
from torchspmd.testing.fuzz.runner import Outcome

__all__ = ["Program", "Outcome", "generate", "run_program", "repro_script", "fuzz"]
