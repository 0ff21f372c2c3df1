"""``torch_xla.amp.syncfree``: ``Adam``, ``AdamW`` and ``SGD`` are ``torch.optim``'s.

PyTorch/XLA's versions skip a step whose gradients hold an inf without reading that on the
host. Here ``torch.optim``'s own optimizers already compile into the step (their state on
the device), and ``GradScaler`` decides skipping; the same arguments work.

Example: ``opt = torch_xla.amp.syncfree.AdamW(model.parameters(), lr=1e-3)``.
"""

from torch.optim import SGD, Adam, AdamW  # noqa: F401
