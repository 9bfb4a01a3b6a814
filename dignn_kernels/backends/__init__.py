"""The backends: one module each, holding only its passes and their registration, behind the
pass interface of :mod:`dignn_kernels.backends.interface`.

- ``"cpu"``, ``"cuda"``: :mod:`~dignn_kernels.backends.compiled` (the ``torch.ops.dignn``
  operators, with a fused C++ solve);
- ``"triton"``: :mod:`~dignn_kernels.backends.triton` (Triton kernels, on CUDA; on the CPU
  only in the Triton interpreter);
- ``"torch"``: :mod:`~dignn_kernels.backends.pytorch` (plain PyTorch, any device).

:data:`BACKENDS` is the one list of names; :func:`get_backend` returns a backend's record and
:func:`available_backends` those that run on a device, in the order ``backend="auto"`` tries
them. Adding a backend: a module that builds a :class:`Backend` and one entry in
:data:`_REGISTRY` below.

16-bit storage (``storage_dtype``, :data:`STORAGE_DTYPES`) is a capability of a backend
(:attr:`Backend.storage_dtypes`): :func:`check_storage_dtype` validates the value,
:func:`check_backend_storage` an explicit backend against it, and :func:`available_backends`
leaves out the backends that cannot store in it.
"""
from typing import Dict, Optional, Tuple

import torch

from . import compiled, pytorch, triton
from .interface import STORAGE_DTYPES, Backend, FusedSolve

__all__ = ["Backend", "FusedSolve", "BACKENDS", "get_backend", "available_backends",
           "TRITON_MIN_ENTRIES", "STORAGE_DTYPES", "check_storage_dtype",
           "storage_backends", "check_backend_storage"]

_REGISTRY: Dict[str, Backend] = {b.name: b for b in (compiled.CPU, compiled.CUDA,
                                                      triton.TRITON, pytorch.TORCH)}
BACKENDS: Tuple[str, ...] = tuple(_REGISTRY)

# On a CUDA device with both GPU backends built, ``"auto"`` takes Triton from this many CSR
# entries on and the CUDA kernels below. Measured on an H100 (bench/results/gpu_h100_2026-11-23/
# bench_gpu_speed_summary.txt, one training step, h = 64, 10 + 10 sweeps): cornell5 (1.58M
# entries) cuda 4.83 ms, triton 5.03 ms; the Penn94-shaped graph (2.72M) cuda 7.42, triton
# 6.23; its heavy-row variant 7.50 against 7.13; a uniform graph of that size 5.57 against
# 5.31. Below cornell5's size no Triton step was timed; there the launches dominate, and the
# CUDA backend launches from C++ (bench/gpu_session.sh times both on the real datasets).
TRITON_MIN_ENTRIES = 2_000_000


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`)."""
    backend = _REGISTRY.get(name)
    if backend is None:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    return backend


def check_storage_dtype(storage_dtype) -> Optional[torch.dtype]:
    """``storage_dtype`` itself when it is None (iterates stored in the compute dtype) or one
    of :data:`STORAGE_DTYPES`; else a ValueError naming the choices."""
    if storage_dtype is None or (isinstance(storage_dtype, torch.dtype)
                                 and storage_dtype in STORAGE_DTYPES):
        return storage_dtype
    raise ValueError(f"storage_dtype must be None (iterates stored in the compute dtype), "
                     f"torch.bfloat16 or torch.float16, got {storage_dtype!r}")


def storage_backends(storage_dtype: torch.dtype) -> Tuple[str, ...]:
    """The backends whose passes store iterates and projections in ``storage_dtype``."""
    return tuple(name for name in BACKENDS if storage_dtype in _REGISTRY[name].storage_dtypes)


def check_backend_storage(backend: str, storage_dtype: Optional[torch.dtype]) -> None:
    """A ValueError unless the backend ``backend`` supports ``storage_dtype`` (None: every
    backend does)."""
    if storage_dtype is not None and storage_dtype not in get_backend(backend).storage_dtypes:
        raise ValueError(
            f"storage_dtype={storage_dtype} is not supported by backend={backend!r}: the "
            f"backends that store the iterates in 16 bits are {storage_backends(storage_dtype)}"
            f". Use one of them or backend='auto' (which picks one), or storage_dtype=None.")


def available_backends(device: torch.device, num_entries: Optional[int] = None,
                       storage_dtype: Optional[torch.dtype] = None) -> Tuple[str, ...]:
    """The backends that can run on ``device``, the one ``"auto"`` picks first: the compiled
    one of the device, then (on a GPU) Triton, before it for graphs of at least
    :data:`TRITON_MIN_ENTRIES` CSR entries (``num_entries``; None counts as small), then the
    plain-PyTorch fallback. Triton runs on the CPU only in its (slow) interpreter, last.
    With a 16-bit ``storage_dtype`` only the backends that support it (see
    :attr:`Backend.storage_dtypes`).

    Args:
        device: the tensors' ``torch.device`` (or a string such as ``"cuda:0"``).
        num_entries: the graph's CSR entries (edges plus self-loops), or None (small).
        storage_dtype: None, ``torch.bfloat16`` or ``torch.float16``: only the backends whose
            passes store iterates in it.

    Returns:
        Tuple[str, ...]: the backend names, the one ``backend="auto"`` picks first.

    Example:
        >>> import torch
        >>> from dignn_kernels import available_backends
        >>> available_backends(torch.device("cpu"))[0]
        'cpu'
    """
    device = torch.device(device)
    found = [name for name in BACKENDS if _REGISTRY[name].available(device)
             and (storage_dtype is None or storage_dtype in _REGISTRY[name].storage_dtypes)]
    if "triton" in found:
        found.remove("triton")
        if device.type == "cuda":
            large = num_entries is not None and num_entries >= TRITON_MIN_ENTRIES
            found.insert(0 if large else len(found) - 1, "triton")
        else:
            found.append("triton")
    return tuple(found)
