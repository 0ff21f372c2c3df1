"""A process that dies makes the others stop with an error, never hang."""

from pathlib import Path

from .launcher import spawn

HERE = Path(__file__).parent

# The survivor fails in one of two ways, whichever comes first: its next read needs
# the dead process (torchspmd's error), or JAX's coordinator misses the dead process's
# heartbeats (5 s here) while the survivor is busy elsewhere, compiling say (JAX's).
READ_FAILED = "torchspmd: process 0 could not read a value because a collective"
HEARTBEATS_MISSED = "This most likely indicates that another task died"


def test_when_one_process_is_killed_the_other_exits_with_an_error(tmp_path):
    # The launch is bounded: a survivor still waiting after 90 s fails the test.
    survivor, dead = spawn(HERE / "dies.py", str(tmp_path / "process-0-read"), timeout=90,
                           TORCHSPMD_CPU_DEVICES="4")
    assert "process 0 read 4032.0" in survivor.output, survivor.output[-3000:]
    assert dead.returncode != 0
    assert survivor.returncode != 0, survivor.output[-3000:]
    assert READ_FAILED in survivor.output or HEARTBEATS_MISSED in survivor.output, \
        survivor.output[-3000:]
