"""The paper's two empirical figures (section "Empirical validation of theoretical results"):

- :func:`convergence_study` / :func:`plot_convergence`: ||Z_t - Z_{t-1}||_F against t for a
  trained DIGNN-Delta_Phi (mu = 2, other hyperparameters from table 7), one line per dataset.
- :func:`mu_study` / :func:`plot_mu`: for each mu, a model with spectrally normalized Θχ and
  Θφ (T = 10) is trained; the figure shows ||Z_T - Z_{T-1}||_F, the generalization gap
  |test loss - train loss| and the test accuracy against mu.

Each study returns plain dicts (also written as JSON by the CLI) and each plot function writes
a PNG with matplotlib's non-interactive Agg backend.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .data import load_dataset
from .device import resolve_device
from .files import write_atomically
from .presets import preset_config
from .spectral import fixed_point_residuals
from .training import train_node_split

__all__ = ["convergence_study", "mu_study", "plot_convergence", "plot_mu", "plot_curves"]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _load(name, data_root, cache_dir, device, threads: Optional[Callable[[int], None]],
          hidden: int):
    """A node dataset on ``device``; ``threads(work)`` (the CLI's thread choice) is told the
    size of one sweep."""
    data = load_dataset(name, data_root, cache_dir)
    if data.task != "node":
        raise ValueError(f"the figures are drawn on node datasets; {name!r} is a graph "
                         f"classification dataset")
    if threads is not None:
        threads((data.num_nodes + data.edge_index.size(1)) * hidden)
    return data.to(resolve_device(device))


def _trained(dataset, config, progress: bool, **run):
    result = train_node_split(dataset, config, 0, progress=progress, keep_model=True, **run)
    model = result.model
    model.eval()
    with torch.no_grad():
        h = model.diffusion_input(dataset.x, dataset.edge_index)
    return result, model, h


def _save(fig, plt, path) -> Path:
    """Writes ``fig`` as a PNG to ``path`` whole or not at all (a temporary renamed)."""
    try:
        return write_atomically(Path(path).expanduser(),
                                lambda f: fig.savefig(f, format="png", dpi=120))
    finally:
        plt.close(fig)


def convergence_study(datasets: Sequence[str] = ("csbm",), data_root=None, cache_dir=None,
                      mu: float = 2.0, num_iter: int = 30, epochs: Optional[int] = None,
                      progress: bool = False, device="auto",
                      threads: Optional[Callable[[int], None]] = None,
                      **run) -> Dict[str, Dict]:
    """For each dataset: trains DIGNN-Delta_Phi on split 0 (``mu``, the paper's fixed-point
    iteration, the rest from the preset) and records ||Z_t - Z_{t-1}||_F for t = 1..num_iter at the trained layer's input.
    ``device`` and ``run`` (``compile_model``, ``sync_every``) as for
    :func:`dignn.training.train_node_split`."""
    out = {}
    for name in datasets:
        # the paper's figure studies its own iteration, so the layer trains with it (not the
        # presets' solver rule, dignn.presets.preset_solver)
        config = preset_config(name, "neural", mu=mu, epochs=epochs, solver="fixed_point")
        data = _load(name, data_root, cache_dir, device, threads, config.hidden)
        result, model, h = _trained(data, config, progress, **run)
        residuals = fixed_point_residuals(model.diffusion, h, data.edge_index, num_iter)
        out[data.name] = {"mu": mu, "residuals": residuals, "test_acc": result.test_acc,
                          "lambda_max": result.lambda_max_end, "epochs": config.epochs}
    return out


def mu_study(dataset: str = "csbm", mus: Sequence[float] = (1.0, 1.25, 1.5, 2.0, 2.5, 5.0),
             data_root=None, cache_dir=None, epochs: Optional[int] = None,
             max_iter: int = 10, progress: bool = False, device="auto",
             threads: Optional[Callable[[int], None]] = None, **run) -> Dict[str, List]:
    """For each mu: trains DIGNN-Delta_Phi with spectrally normalized Θχ, Θφ and ``max_iter``
    iterations of the paper's fixed point on split 0, and records ||Z_T - Z_{T-1}||_F (T = max_iter), the generalization
    gap |test loss - train loss| and the test accuracy at the selected epoch. ``device`` and
    ``run`` as for :func:`convergence_study`."""
    data = _load(dataset, data_root, cache_dir, device, threads,
                 preset_config(dataset, "neural").hidden)
    rows = {"dataset": data.name, "mu": [], "residual": [], "gap": [], "test_acc": [],
            "lambda_max": []}
    for mu in mus:
        config = preset_config(dataset, "neural", mu=float(mu), max_iter=max_iter,
                               epochs=epochs, spectral_norm=True, solver="fixed_point")
        result, model, h = _trained(data, config, progress, **run)
        residual = fixed_point_residuals(model.diffusion, h, data.edge_index, max_iter)[-1]
        rows["mu"].append(float(mu))
        rows["residual"].append(residual)
        rows["gap"].append(abs(result.test_loss - result.train_loss))
        rows["test_acc"].append(result.test_acc)
        rows["lambda_max"].append(result.lambda_max_end)
    return rows


def plot_convergence(study: Dict[str, Dict], path) -> Path:
    """The convergence figure: log-scale ||Z_t - Z_{t-1}||_F against t."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for name, row in study.items():
        t = range(1, len(row["residuals"]) + 1)
        ax.semilogy(t, [max(r, 1e-300) for r in row["residuals"]], marker="o", markersize=3,
                    label=f"{name} (mu={row['mu']:g}, lambda_max~{row['lambda_max']:.2f})")
    ax.set_xlabel("iteration t")
    ax.set_ylabel(r"$\|Z^{(t)} - Z^{(t-1)}\|_F$")
    ax.set_title(r"Convergence of DIGNN-$\Delta_\Phi$")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_mu(study: Dict[str, List], path) -> Path:
    """The mu figure: residual, generalization gap and test accuracy against mu."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11.0, 3.4))
    mus = study["mu"]
    axes[0].semilogy(mus, [max(r, 1e-300) for r in study["residual"]], marker="o")
    axes[0].set_ylabel(r"$\|Z^{(T)} - Z^{(T-1)}\|_F$")
    axes[1].plot(mus, study["gap"], marker="o", color="tab:red")
    axes[1].set_ylabel(r"$|L_u(f) - \hat L_m(f)|$ (test - train loss)")
    axes[2].plot(mus, [100 * a for a in study["test_acc"]], marker="o", color="tab:green")
    axes[2].set_ylabel("test accuracy (%)")
    for ax in axes:
        ax.set_xlabel(r"$\mu$")
        ax.grid(True, alpha=0.3)
    fig.suptitle(rf"Impact of $\mu$ on DIGNN-$\Delta_\Phi$ ({study['dataset']}, "
                 r"spectrally normalized $\Theta_\chi, \Theta_\phi$)")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_curves(curves: Dict[str, List[Dict[str, float]]], path) -> Path:
    """The training curves of ``dignn train --log-dir`` (:func:`dignn.logs.read_curves`):
    loss and accuracy against the epoch, one colour per split, training solid and validation
    dashed."""
    import math
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for k, (name, rows) in enumerate(curves.items()):
        color = colors[k % len(colors)]
        epochs = [r["epoch"] for r in rows]
        for ax, column, style, what in ((axes[0], "train_loss", "-", "train"),
                                        (axes[0], "val_loss", "--", "val"),
                                        (axes[1], "train_acc", "-", "train"),
                                        (axes[1], "val_acc", "--", "val")):
            values = [r[column] for r in rows]
            if all(math.isnan(v) for v in values):
                continue
            scale = 100.0 if column.endswith("_acc") else 1.0
            ax.plot(epochs, [scale * v for v in values], style, color=color,
                    label=f"{name} {what}")
    axes[0].set_ylabel("loss (train: training step; val: evaluation)")
    axes[1].set_ylabel("accuracy (%)")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2 if len(curves) > 4 else 1)
    fig.suptitle("DIGNN training curves (solid: train, dashed: validation)")
    fig.tight_layout()
    return _save(fig, plt, path)
