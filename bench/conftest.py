"""Shared pieces of the benchmarks: real graphs from ../shared/data and peak-memory probes.

Run with ``pytest bench/ --benchmark-json bench/results/<name>.json``; set DIGNN_DATA to the
folder that holds the datasets (default: ../shared/data next to the checkout).
"""
import contextlib
import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch

DATA_ROOT = Path(os.environ.get("DIGNN_DATA", Path(__file__).resolve().parents[2] / "shared" /
                                "data"))


def load_facebook100(name: str):
    """(edge_index, num_nodes) of a facebook100 graph stored as LINKX's raw data.mat."""
    path = DATA_ROOT / name / "raw" / "data.mat"
    if not path.exists():
        pytest.skip(f"{path} not found (set DIGNN_DATA to the datasets folder)")
    import numpy as np
    import scipy.io
    adj = scipy.io.loadmat(str(path))["A"].tocoo()
    edge_index = torch.from_numpy(np.vstack([adj.row, adj.col]).astype(np.int64))
    return edge_index, adj.shape[0]


def reference_step(layer, xr, edge_index, max_iter: int):
    """One training step of the reference algorithm (:mod:`dignn_kernels.reference`, the
    paper's, with ``layer``'s weights and mu; ``max_iter`` iterations, tol = 0) on the leaf
    ``xr``: forward, the backward of sum(z^2), the gradients cleared."""
    from dignn_kernels import reference
    th = dict(theta_chi=layer.theta_chi.weight, theta_phi=layer.theta_phi.weight,
              theta_varphi=layer.theta_varphi.weight)

    def step():
        z = reference.reference_implicit_diffusion(xr, edge_index, mu=layer.mu,
                                                   max_iter=max_iter, tol=0.0, **th)
        z.square().sum().backward()
        xr.grad = None
        layer.zero_grad(set_to_none=True)
    return step


@contextlib.contextmanager
def without(backend: str, part: str, enabled: bool = True):
    """While the block runs (if ``enabled``), backend ``backend`` without its optional
    ``part`` of the pass interface: "fused_solve" (its solves take the solvers' Python loop
    over its passes), "row_step" (that loop takes its norms from the row pass's output) or
    "row_product" (cg's sweep is the row pass, its dots a second pass). The same results (to
    rounding for the dots), the path the part replaces."""
    from dignn_kernels import backends
    whole = backends._REGISTRY[backend]
    if enabled:
        backends._REGISTRY[backend] = dataclasses.replace(whole, **{part: None})
    try:
        yield
    finally:
        backends._REGISTRY[backend] = whole


def solvers_loop(backend: str, enabled: bool = True):
    """:func:`without` the fused solve: the solvers' loop over the backend's passes."""
    return without(backend, "fused_solve", enabled)


class PeakMemory:
    """Peak resident memory growth of the process while a block runs (Linux)."""

    def __enter__(self):
        if not sys.platform.startswith("linux"):
            raise RuntimeError("peak memory is read from /proc (Linux only)")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.start = self._read("VmRSS")
        return self

    def __exit__(self, *exc):
        self.growth_mb = (self._read("VmHWM") - self.start) / 1024.0
        return False

    @staticmethod
    def _read(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])  # kB
        raise RuntimeError(f"{field} not in /proc/self/status")


# A benchmark module's summary, registered with :func:`summary` under the environment variable
# that names its file, until it has been stated: a run interrupted before its summary test
# (SIGINT: bench/gpu/gpu_session.sh stops a phase that way when its time is up) still states what
# it measured, in pytest_sessionfinish below.
PENDING_SUMMARIES = {}


def summary(env_var):
    """Decorator: ``build()`` returns a benchmark's summary so far as (lines, checks), or None
    when nothing was measured; stated by the module's summary test or, if the run is
    interrupted first, by this conftest."""
    def register(build):
        PENDING_SUMMARIES[env_var] = build
        return build
    return register


def state_goals(lines, checks, env_var, interrupted=False):
    """A benchmark's summary: ``lines``, a blank line and the text of each check (ok, text),
    printed and written to the file that environment variable ``env_var`` names (if set);
    then fails if a check is missed. ``interrupted``: the run stopped before its end, so the
    summary is marked partial and nothing fails."""
    PENDING_SUMMARIES.pop(env_var, None)
    if interrupted:
        lines = ["INTERRUPTED: the run was stopped before its end (out of time?); only what "
                 "was measured until then", ""] + list(lines)
    summary = "\n".join(list(lines) + [""] + [text for _, text in checks])
    print("\n" + summary)
    path = os.environ.get(env_var)
    if path:
        with open(path, "w") as f:
            f.write(summary + "\n")
    missed = [text for ok, text in checks if not ok]
    assert interrupted or not missed, "goals missed:\n" + "\n".join(missed)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus != pytest.ExitCode.INTERRUPTED:
        return  # a whole run states its goals in its summary test
    for env_var, build in list(PENDING_SUMMARIES.items()):
        try:
            stated = build()
        except Exception as err:  # noqa: BLE001 - a partial summary must not hide the rest
            stated = [f"the summary failed on partial results: {err!r}"], []
        if stated is not None:
            state_goals(*stated, env_var, interrupted=True)
