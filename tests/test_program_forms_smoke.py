"""benchmarks/program_forms.py: the program-size facts docs/performance.md quotes.

Program sizes are deterministic, so the documented comparisons are checked here (an XLA
upgrade that changes them shows as a failure, and the doc must be updated with it).
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shared_step_counter_input_lets_xla_merge_the_per_parameter_scalar_math():
    sizes = list(_load("program_forms").step_counter_forms().values())
    per_parameter, shared_input, shared_output = sizes
    assert shared_input.fusions < per_parameter.fusions
    assert shared_input.fusions == shared_output.fusions
    assert shared_output.outputs == per_parameter.outputs - (_load("program_forms").PARAMETERS - 1)


def test_torch_weight_gradient_is_one_dot_where_jax_form_is_two_fusions():
    torch_form, jax_form = _load("program_forms").weight_gradient_forms().values()
    assert (torch_form.dots, torch_form.fusions) == (1, 0)
    assert jax_form.dots == 0 and jax_form.fusions >= 1
