"""``python -m torchspmd.compat SCRIPT [ARGS...]``: run a PyTorch/XLA SPMD script unchanged."""

import sys

from torchspmd.compat import run_script

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print("usage: python -m torchspmd.compat SCRIPT [ARGS...]\n\n"
          "Runs SCRIPT with `import torch_xla...` served by torchspmd.", file=sys.stderr)
    sys.exit(0 if len(sys.argv) >= 2 else 2)
run_script(sys.argv[1], sys.argv[2:])
