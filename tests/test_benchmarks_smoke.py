"""The training-step benchmark runs end to end at tiny sizes (no wall-clock thresholds)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--steps", "3", "--warmup", "3", "--batch", "2", "--seq", "8", "--dim", "16",
        "--layers", "1", "--heads", "2", "--vocab", "32"]


def test_train_step_benchmark_runs_and_matches_jax():
    # One CPU device, as the benchmark's own default; set here so an outer
    # TORCHSPMD_CPU_DEVICES (the test suite's 8) does not make it run each op 8 times.
    env = dict(os.environ, TORCHSPMD_CPU_DEVICES="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), *TINY],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "ratio torchspmd / JAX:" in out, out
    assert "ratio compiled / JAX:" in out, out
    assert "loss check (torchspmd): PASS" in out, out
    assert "loss check (compiled): PASS" in out, out
    assert "compiles after warm-up: torchspmd 0 " in out, out
    assert " 0 captures (must be 0)" in out, out


def test_train_step_benchmark_sharded_matches_jax():
    # --mesh sets TORCHSPMD_CPU_DEVICES itself (A*B), over any outer value.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), *TINY,
                           "--mesh", "2x2", "--strategy", "fsdp+tp"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "mesh {'data': 2, 'model': 2}, strategy fsdp+tp" in out, out
    assert "collectives per step: torchspmd " in out, out
    assert "loss check (torchspmd): PASS" in out, out
    assert "loss check (compiled): PASS" in out, out
    assert "compiles after warm-up: torchspmd 0 " in out, out


def test_generate_benchmark_matches_cpu_tokens():
    env = dict(os.environ, TORCHSPMD_CPU_DEVICES="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "generate.py"), "--tokens", "2",
                           "--layers", "1", "--dim", "16", "--prompt", "3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "tokens equal CPU: PASS" in out, out
    assert "ops run again: 0;" in out, out
    # one prefill program and one greedy step, every token after the first in one launch of it
    assert "torchspmd  |        2 |" in out, out
    assert "greedy loops on the device: 8 of 8 calls" in out, out


def test_checkpoint_memory_benchmark_shows_less_temporary_memory():
    env = dict(os.environ, TORCHSPMD_CPU_DEVICES="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "checkpoint_memory.py"),
                           "--blocks", "3", "--dim", "16", "--batch", "64"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: PASS" in proc.stdout, proc.stdout


def test_gpu_check_dry_run_runs_every_section_and_a_one_point_sweep(tmp_path):
    """benchmarks/gpu_check.sh --dry-run: tests, the GPT example and sweep.py --grid smoke
    (an 8-device fsdp+tp point) all run and land in one results file."""
    out = tmp_path / "results.txt"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("TORCHSPMD_CPU_DEVICES", None)  # the script and the sweep set their own
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    text = out.read_text()
    assert proc.returncode == 0, text + proc.stderr
    for section in ("tests", "gpt", "sweep"):
        assert f"== {section}: exit 0" in text, text
    assert 'GPT {"device"' in text and '"tokens_per_s"' in text, text
    assert "gpt d64 L1 b8 8 dev fsdp+tp" in text, text
    assert "recompiles after capture, all points: 0 (target 0)  MET" in text, text
    assert "losses agree with JAX" in text and "(PASS)" in text, text
    assert (tmp_path / "results_sweep.png").stat().st_size > 0
    assert "== gpu_check done: 0 section(s) failed" in text, text


def test_host_floor_benchmark_prints_every_floor_next_to_jax():
    env = dict(os.environ, TORCHSPMD_CPU_DEVICES="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_floor.py"),
                           "--points", "mlp:16:1", "--steps", "2", "--warmup", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "mlp d16 L1" in out, out
    assert "worst: dispatch " in out and "compiled floor " in out, out


def test_launch_phases_benchmark_runs():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launch_phases.py"),
                           "--point", "mlp:16:1", "--steps", "4", "--warmup", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for phase in ("before the call", "the XLA call", "after it", "whole launch", "JAX host"):
        assert phase in proc.stdout, proc.stdout
