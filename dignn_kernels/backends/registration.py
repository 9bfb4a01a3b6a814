"""The autograd formula of a neural-edge-weights op, registered the same way for every backend
whose op is a dispatcher op (the compiled ``dignn::neural_edge_weights``, the Triton
``dignn_triton::neural_edge_weights``).

With dl/dW given and kappa_i = sum_j W_ij (so dl/dW_ij gets dl/dkappa_i added), dl/dp and
dl/dq come from the backend's edge-weights backward op on the CSR and its transpose. That op
is not differentiable itself: when the backward is to be differentiated again (it runs with
grad mode on, ``create_graph=True``, or under forward-mode AD) the same chain rule runs as
torch ops (:func:`dignn_kernels.backends.pytorch.edge_weights_vjp`), whose derivatives torch
takes (eq. 13-14 differentiated twice).
"""
from typing import Callable

import torch
from torch.autograd import forward_ad

from ..csr import csr_rows, transpose_csr
from .pytorch import edge_weights_vjp

__all__ = ["register_edge_weights_autograd", "forward_ad_active", "differentiable_backward",
           "run_without_autocast"]


def forward_ad_active() -> bool:
    """Whether a forward-mode AD level is open (``torch.autograd.forward_ad.dual_level``, which
    ``torch.func.jvp``, ``jacfwd`` and ``hessian`` open too): tensors may then carry tangents
    that an op without a forward-mode formula would drop."""
    return getattr(forward_ad, "_current_level", -1) >= 0


def differentiable_backward() -> bool:
    """Whether a backward running now must be built from differentiable calls: its result is
    differentiated again (grad mode is on inside a backward only with ``create_graph=True``,
    as ``torch.func`` transforms run it) or pushed forward (forward-mode AD)."""
    return torch.is_grad_enabled() or forward_ad_active()


def register_edge_weights_autograd(op: str, backward_op: Callable) -> None:
    """Registers the backward of ``op(rowptr, col, a, p, q, eps) -> (w, kappa)``, with
    ``backward_op(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm) -> (gp, gq)``
    for a plain backward and the torch chain rule where it is differentiated again."""

    def setup_context(ctx, inputs, output):
        rowptr, col, a, p, q, eps = inputs
        ctx.save_for_backward(rowptr, col, a, p, q)
        ctx.eps = eps

    def backward(ctx, grad_w, grad_kappa):
        rowptr, col, a, p, q = ctx.saved_tensors
        g = grad_w if grad_w is not None else torch.zeros_like(a)
        if grad_kappa is not None:  # kappa_i = sum_j W_ij over row i
            g = g + grad_kappa[csr_rows(rowptr, col.shape[0])]
        with_a = ctx.needs_input_grad[2]
        if differentiable_backward() or with_a:
            grad_a, grad_p, grad_q = edge_weights_vjp(rowptr, col, a, p, q, ctx.eps, g, with_a)
            return None, None, grad_a, grad_p, grad_q, None
        t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, rowptr.shape[0] - 1)
        grad_p, grad_q = backward_op(rowptr, col, a, p, q, ctx.eps, g.contiguous(), t_rowptr,
                                     t_col, t_perm)
        return None, None, None, grad_p, grad_q, None

    torch.library.register_autograd(op, backward, setup_context=setup_context)


# The libraries that hold the autocast kernels (a registration lives as long as its library).
_AUTOCAST_LIBRARIES = {}


def run_without_autocast(qualname: str) -> None:
    """Registers, for CPU and CUDA autocast, a kernel that runs the op ``qualname``
    (``"namespace::name"``) with autocast off and its inputs as given: every sum of a solve or
    a pass accumulates in the compute dtype the op is given (float32 or float64), and the
    dense products inside an op (the projections' gradients, Anderson's small least squares)
    would otherwise be cast to 16 bits by the autocast region the op is called in, forward or
    backward (the autograd engine runs a CPU backward in the caller's thread, autocast on).

    Args:
        qualname: the op, e.g. ``"dignn::implicit_solve"``.
    """
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    if namespace not in _AUTOCAST_LIBRARIES:
        _AUTOCAST_LIBRARIES[namespace] = torch.library.Library(namespace, "IMPL")
    library = _AUTOCAST_LIBRARIES[namespace]
    for device_type, key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")):
        def kernel(*args, _op=op, _device_type=device_type, **kwargs):
            with torch.autocast(_device_type, enabled=False):
                return _op(*args, **kwargs)
        library.impl(name, kernel, key)

