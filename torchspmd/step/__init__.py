"""Compiled steps: ``torchspmd.compile`` captures a step once and replays it as one call.

Modules, one idea each: ``places`` (the slots state lives in), ``optim`` (optimizers made
replayable), ``signature`` (the cache key of a call), ``capture`` (record a call, find its
inputs and outputs), ``wiring`` (how the program connects to the step's state),
``recycle`` (old gradients' buffers handed to the program), ``plan`` (the compiled
replay), ``api`` (the decorator).
"""

from torchspmd.step.api import CheckMissError, CompiledStep, compile
from torchspmd.step.capture import RebindingError
from torchspmd.lazy.provenance import HostReadInStep

__all__ = ["compile", "CompiledStep", "CheckMissError", "RebindingError", "HostReadInStep"]
