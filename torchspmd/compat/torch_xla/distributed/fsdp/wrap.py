"""``torch_xla.distributed.fsdp.wrap``: PyTorch's auto-wrap policies (same meaning).

``SpmdFullyShardedDataParallel(auto_wrap_policy=...)`` accepts them.
"""

from torch.distributed.fsdp.wrap import (lambda_auto_wrap_policy,  # noqa: F401
                                         size_based_auto_wrap_policy,
                                         transformer_auto_wrap_policy)
