"""Counters of what the runtime did: the numbers users check to see recompiles and copies."""

from __future__ import annotations

# The design's metrics registry: name -> number, updated in place by the runtime.
COUNTERS: dict[str, float] = {}


def reset() -> None:
    """Zero every counter. Example: ``reset(); ...; metrics()["graphs_compiled"]``."""
    COUNTERS.clear()  # counters named at run time (generate_recompiles_<input>) go too
    COUNTERS.update(
        graphs_compiled=0,  # XLA compilations (a new graph, or new input shardings)
        shape_recompiles=0,  # programs compiled for a graph seen before with other shapes
        backward_calls=0,  # backward() / autograd.grad calls (any device)
        cache_hits=0,  # syncs whose graph was already compiled
        executions=0,  # compiled programs run
        ops_traced=0,  # aten calls recorded
        ops_executed=0,  # recorded nodes run by programs
        ops_rerun=0,  # of those, nodes an earlier program had run already (work done twice)
        trace_time_s=0.0,  # time spent recording those calls
        compile_time_s=0.0,  # time spent tracing to JAX and compiling with XLA
        # CPU time of the process (all threads: XLA compiles kernels in parallel) spent
        # tracing and compiling: steadier than compile_time_s on a shared, loaded machine
        compile_cpu_s=0.0,
        bytes_to_device=0,  # host -> device, summed over devices
        bytes_to_host=0,  # device -> host
        programs_evicted=0,  # compiled programs dropped from the bounded compile cache
        step_captures=0,  # torchspmd.compile: calls whose Python ran under the recorder
        step_replays=0,  # compiled-step calls that ran as one program, no Python
        step_warmups=0,  # captures run lazily because state appeared on first use
        # captures not kept: the step left tensors it made where no walk finds them (a
        # helper function's global), so the next call captures again
        step_hidden_state=0,
        step_recaptures_hyperparameters=0,  # a Python-number hyperparameter changed
        step_recaptures_check=0,  # check_every re-recordings
        step_recaptures_state=0,  # state changed outside the step (p.grad set to None...)
        # replays that read a slot's new tensor of the same kind (new gradients after
        # zero_grad() in gradient accumulation) instead of capturing again
        step_slot_follows=0,
        step_check_misses=0,  # check_every found another path
        donated_bytes=0,  # buffers handed to a step that overwrote them
        # host seconds inside the XLA call of compiled steps (the rest of a call's host
        # time is torchspmd's own: gathering state, donation checks, writing back)
        step_call_s=0.0,
        # ownership questions refused because this interpreter's reference counts did not
        # pass ownership's self-test (``torchspmd.runtime.ownership.COUNTING.reason``)
        donation_disabled=0,
        scan_body_traces=0,  # scan_layers: a recorded layer replayed while JAX traces a scan
        # generation: model calls of a decoding loop that compiled again (and, named
        # generate_recompiles_<input>, per input whose shape changed)
        generate_recompiles=0,
        # greedy generate calls whose tokens after the first were picked on the device
        # (``generation/greedy.py``), and the decode steps they ran
        generate_device_loops=0,
        generate_device_tokens=0,
    )


def metrics() -> dict[str, float]:
    """A copy of the counters.

    Example::

        >>> torchspmd.metrics()["graphs_compiled"]
        3
    """
    return dict(COUNTERS)


reset()
