"""The spmd PyTorch device."""

import torch

# PyTorch must know the name before any torch.device("spmd") is made.
if torch._C._get_privateuse1_backend_name() != "spmd":
    torch.utils.rename_privateuse1_backend("spmd")
