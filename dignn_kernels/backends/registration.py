"""The autograd formula of a neural-edge-weights op, registered the same way for every backend
whose op is a dispatcher op (the compiled ``dignn::neural_edge_weights``, the Triton
``dignn_triton::neural_edge_weights``).

With dl/dW given and kappa_i = sum_j W_ij (so dl/dW_ij gets dl/dkappa_i added), dl/dp and
dl/dq come from the backend's edge-weights backward op on the CSR and its transpose.
"""
from typing import Callable

import torch

from ..csr import csr_rows, transpose_csr

__all__ = ["register_edge_weights_autograd"]


def register_edge_weights_autograd(op: str, backward_op: Callable) -> None:
    """Registers the backward of ``op(rowptr, col, a, p, q, eps) -> (w, kappa)``, with
    ``backward_op(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col, t_perm) -> (gp, gq)``."""

    def setup_context(ctx, inputs, output):
        rowptr, col, a, p, q, eps = inputs
        ctx.save_for_backward(rowptr, col, a, p, q)
        ctx.eps = eps

    def backward(ctx, grad_w, grad_kappa):
        rowptr, col, a, p, q = ctx.saved_tensors
        g = grad_w if grad_w is not None else torch.zeros_like(a)
        if grad_kappa is not None:  # kappa_i = sum_j W_ij over row i
            g = g + grad_kappa[csr_rows(rowptr, col.shape[0])]
        t_rowptr, t_col, t_perm = transpose_csr(rowptr, col, rowptr.shape[0] - 1)
        grad_p, grad_q = backward_op(rowptr, col, a, p, q, ctx.eps, g.contiguous(), t_rowptr,
                                     t_col, t_perm)
        return None, None, None, grad_p, grad_q, None

    torch.library.register_autograd(op, backward, setup_context=setup_context)
