"""What the default in-graph index checks add to a GPT training step's program.

XLA's cost analysis of the step's forward and backward (the TinyTransformer of
``torchspmd.testing.models``, 1 device) with ``torchspmd.debug.index_checks`` on and off:
flops, bytes accessed, fusions and output bytes. These counts are deterministic, unlike
timings on a shared machine. Then the host's side: the main thread's CPU time per call of
a ``torchspmd.compile``d AdamW step (the flag is one more output, polled after later
calls), checks on and off in alternating blocks, medians. For step times, compare
``TORCHSPMD_INDEX_CHECKS=1`` and ``=0`` runs of ``benchmarks/train_step.py`` back to back.

    python benchmarks/index_check_cost.py
"""

import statistics
import time

import torch

import torchspmd
from torchspmd.debug import index_checks, pending_program
from torchspmd.device import index_checks as checks
from torchspmd.testing.models import TinyTransformer

VOCAB = 256


def step_costs(on: bool) -> dict[str, float]:
    """Cost analysis of one step's program, with the checks ``on`` or off."""
    index_checks(on)
    torch.manual_seed(0)
    model = TinyTransformer(vocab=VOCAB, dim=128, heads=4, layers=2, seq=64).to(torchspmd.device())
    ids = torch.randint(0, VOCAB, (8, 65)).to(torchspmd.device())
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    flag = checks.take_flag()  # the checks' folded flag: an output of the same program
    compiled = pending_program([loss, *grads, *([flag.tensor] if flag else [])]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    torchspmd.sync()
    return {"flops": cost["flops"], "bytes accessed": cost["bytes accessed"],
            "fusions": compiled.as_text().count(" fusion("),
            "output bytes": compiled.memory_analysis().output_size_in_bytes}


def compiled_step(on: bool):
    """A compiled AdamW step of a small GPT recorded with the checks ``on`` or off, warm."""
    index_checks(on)
    torch.manual_seed(0)
    model = TinyTransformer(vocab=64, dim=32, heads=4, layers=2, seq=16).to(torchspmd.device())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (8, 17)).to(torchspmd.device())

    @torchspmd.compile
    def step(ids):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(5):
        step(ids)
    torchspmd.wait_device_ops()
    return lambda: step(ids)


def host_ms_per_call(blocks: int = 6, calls: int = 40) -> dict[bool, float]:
    """Median main-thread CPU ms per compiled call, checks on and off, in alternating blocks."""
    steps = {on: compiled_step(on) for on in (True, False)}
    medians: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(blocks):
        for on, call in steps.items():
            index_checks(on)
            times = []
            for _ in range(calls):
                start = time.thread_time()
                call()
                times.append(time.thread_time() - start)
            torchspmd.wait_device_ops()
            medians[on].append(statistics.median(times) * 1e3)
    return {on: statistics.median(m) for on, m in medians.items()}


def main() -> None:
    on, off = step_costs(True), step_costs(False)
    print(f"{'':15s} {'checks on':>14s} {'off':>14s} {'on/off':>8s}")
    for name in on:
        print(f"{name:15s} {on[name]:14.0f} {off[name]:14.0f} {on[name] / off[name]:8.4f}")
    host = host_ms_per_call()
    index_checks(True)
    print(f"{'host CPU ms/call':15s} {host[True]:14.3f} {host[False]:14.3f} "
          f"{host[True] / host[False]:8.4f}  (compiled step; median of blocks)")


if __name__ == "__main__":
    main()
