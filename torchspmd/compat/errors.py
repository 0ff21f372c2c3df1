"""The one error for PyTorch/XLA calls that have no meaning on torchspmd."""

from __future__ import annotations

from typing import NoReturn


def unsupported(call: str, instead: str) -> NoReturn:
    """Raise ``NotImplementedError`` naming ``call`` and the torchspmd alternative.

    Example::

        >>> unsupported("xm.all_reduce", "mark_sharding; XLA inserts the collectives")
        Traceback (most recent call last):
        NotImplementedError: torchspmd.compat: xm.all_reduce has no meaning here ...
    """
    raise NotImplementedError(f"torchspmd.compat: {call} has no meaning here (one SPMD program "
                              f"spans every device); {instead}.")


def refusing(call: str, instead: str):
    """A function that raises :func:`unsupported` for ``call`` whatever its arguments.

    Example: ``spawn = refusing("xmp.spawn", "run the script directly or under torchrun")``.
    """
    def refuse(*args, **kwargs) -> NoReturn:
        unsupported(call, instead)
    refuse.__name__ = call.rsplit(".", 1)[-1]
    refuse.__doc__ = f"Raises: ``{call}`` has no meaning on torchspmd; {instead}."
    return refuse
