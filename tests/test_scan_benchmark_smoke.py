"""benchmarks/scan_layers.py runs end to end at tiny sizes (no wall-clock thresholds)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scan_layers_benchmark_runs_and_losses_agree():
    args = ["--layers", "2", "--steps", "3", "--batch", "2", "--seq", "8", "--dim", "16",
            "--heads", "2", "--vocab", "32"]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scan_layers.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "compile time unrolled / scanned:" in out, out
    assert "loss check: PASS" in out, out
