"""PyTorch's own OpInfo samples, run through the spmd device and compared with CPU.

Every entry of ``op_db`` is tried in float32 and int64 (where it supports them). Entries
that do not pass yet are listed in ``opinfo_expected_failures.txt`` and run as strict
expected failures, so a fix shows up as an unexpected pass and the list only shrinks.

Regenerate the list: ``TORCHSPMD_OPINFO_RECORD=1 pytest tests/test_opinfo.py -n 2``
(each failing case appends its id to ``opinfo_failures.new``).
"""

import os
from pathlib import Path

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

import torchspmd

HERE = Path(__file__).parent
EXPECTED_FAILURES = set((HERE / "opinfo_expected_failures.txt").read_text().split())
RECORD = os.environ.get("TORCHSPMD_OPINFO_RECORD")
MAX_SAMPLES = 4
# Ops whose lowering is a loop per sample (orthogonal polynomials, zeta) or a large
# reshape-solve: each sample's loop is compiled anew, ~1.5 s each on a cold cache, so
# they run 2 samples (the suite's 15-minute budget); the others run 4.
LOOPING = {"special.chebyshev_polynomial_t", "special.chebyshev_polynomial_u",
           "special.chebyshev_polynomial_v", "special.chebyshev_polynomial_w",
           "special.shifted_chebyshev_polynomial_t", "special.shifted_chebyshev_polynomial_u",
           "special.shifted_chebyshev_polynomial_v", "special.shifted_chebyshev_polynomial_w",
           "special.hermite_polynomial_h", "special.hermite_polynomial_he",
           "special.laguerre_polynomial_l", "special.legendre_polynomial_p", "special.zeta",
           "linalg.tensorsolve", "linalg.tensorinv"}
# Ops whose values come from a random generator cannot equal CPU's draws.
RANDOM = {"bernoulli", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
          "nn.functional.dropout3d", "normal", "rand_like", "randint", "randint_like", "randn",
          "randn_like", "uniform", "nn.functional.feature_alpha_dropout",
          "nn.functional.alpha_dropout", "empty", "empty_like", "new_empty", "empty_strided",
          "new_empty_strided", "empty_permuted", "nn.functional.rrelu", "torch._refs.empty",
          "geometric", "exponential", "cauchy", "log_normal"}


def _cases():
    for op in op_db:
        if op.name in RANDOM:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in (torch.float32, torch.int64):
            if dtype in supported:
                case = f"{op.name}.{op.variant_test_name}:{str(dtype)[6:]}"
                marks = [pytest.mark.xfail(strict=True)] if case in EXPECTED_FAILURES else []
                yield pytest.param(op, dtype, id=case, marks=marks)


def _to_spmd(x):
    if isinstance(x, torch.Tensor):
        return x.to("spmd")
    if isinstance(x, torch.device) or x == "cpu":  # factory ops: device= is an argument
        return torch.device("spmd")
    return x


def _compare(actual, expected):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), type(actual)
        assert actual.device.type == "spmd", actual.device
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, atol=1e-4,
                                   rtol=1e-4, check_stride=False)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _compare(a, e)
    else:
        assert actual == expected or (actual != actual and expected != expected)


@pytest.mark.parametrize("op,dtype", list(_cases()))
def test_op_matches_cpu(op, dtype, request):
    try:
        count = 2 if op.name in LOOPING else MAX_SAMPLES
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:count]
        results = []
        for sample in samples:
            expected = op(sample.input, *sample.args, **sample.kwargs)
            args = tree_map(_to_spmd, (sample.input, *sample.args))
            kwargs = tree_map(_to_spmd, sample.kwargs)
            results.append((op(*args, **kwargs), expected))
        torchspmd.sync()  # one compiled program for all samples of the case
        for actual, expected in results:
            _compare(actual, expected)
    except Exception:
        if RECORD:
            with open(HERE / "opinfo_failures.new", "a") as f:
                f.write(request.node.callspec.id + "\n")
            pytest.skip("recorded as failing")
        raise
