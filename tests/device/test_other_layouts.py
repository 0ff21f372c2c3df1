"""Sparse, nested and quantized tensors asked of the spmd device are refused by name.

The device holds dense tensors only. Such a request reaches a dispatch key of its own
(``SparsePrivateUse1``...), where PyTorch's dispatcher error named a "Sparsespmd
backend"; torchspmd's error names the op and what to use instead.
"""

import pytest
import torch

REQUESTS = {
    "sparse_coo_tensor(size)": lambda: torch.sparse_coo_tensor((2, 3), device="spmd"),
    "zeros(layout=sparse_coo)": lambda: torch.zeros(2, 3, device="spmd", layout=torch.sparse_coo),
    "to_sparse": lambda: torch.ones(2, 3, device="spmd").to_sparse(),
    # Made without data on some device counts: refused at its first use then.
    "nested_tensor": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                        device="spmd").unbind(),
    "quantized zeros": lambda: torch.zeros(2, dtype=torch.qint8, device="spmd"),
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_tensor_of_another_layout_is_refused_by_name(name):
    with pytest.raises(NotImplementedError, match="dense tensors only"):
        REQUESTS[name]()


def test_dense_work_goes_on_after_a_refusal():
    with pytest.raises(NotImplementedError):
        torch.sparse_coo_tensor((2, 3), device="spmd")
    assert torch.equal((torch.ones(2, device="spmd") * 3).cpu(), torch.full((2,), 3.0))
