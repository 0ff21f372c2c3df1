"""Compiled steps: ``torchspmd.compile`` captures a step once and replays it as one call.

Modules, one idea each, from capture to replay: ``places`` (the slots state lives in),
``unwalked`` (the slots beyond the walk), ``side_effects`` (what a step may not change
in Python), ``optim`` (optimizers made replayable), ``signature`` (the cache key of a
call), ``capture`` (record a call, find its inputs), ``outputs`` (where what it hands out
goes), ``undo`` (what a
refused or failed capture puts back), ``routes`` (the typed records
of where each input comes from and each output goes), ``wiring`` (how the program's
inputs and outputs connect to them), ``recycle`` (old gradients' buffers reused),
``write_back`` (a call's new state), ``plan`` (the compiled replay), ``value_changes``
(a warning for steps compiled again for each new Python value), ``api`` (the
decorator).
"""

from torchspmd.step.api import (CheckMissError, CompiledStep, HiddenStateWarning,
                                NoAutogradWarning, compile)
from torchspmd.step.side_effects import HostStateError, RebindingError
from torchspmd.step.value_changes import ValueRecompileWarning
from torchspmd.lazy.provenance import HostReadInStep

__all__ = ["compile", "CompiledStep", "CheckMissError", "RebindingError", "HostStateError",
           "HostReadInStep", "HiddenStateWarning", "NoAutogradWarning", "ValueRecompileWarning"]
