"""Per-epoch logs of ``dignn train --log-dir DIR`` (:func:`dignn.training.train`'s
``epoch_log``): per split a CSV file ``DIR/<dataset>/split_<k>.csv`` and a TensorBoard run
directory ``DIR/<dataset>/split_<k>/`` holding the same scalars.

The columns (:data:`COLUMNS`): ``epoch`` (1, 2, ...), ``train_loss`` (the training step's loss,
dropout on), ``train_acc``, ``val_loss``, ``val_acc``, ``test_acc`` (the evaluation after the
step; micro-F1 for the multi-label task, as in :class:`~dignn.training.SplitResult`),
``lambda_max`` (empty except on the row of the selected epoch: the spectral check after training
measures the weights of that epoch), ``solver_iterations`` (the iterations of the implicit
layer's forward solve in the epoch's training step; the mean over the batches for tasks on many
graphs) and ``ms_per_epoch`` (each epoch's wall time on the CPU; on a GPU, where the host waits
for the device only at the sync points, the mean of the epochs between two of them).

Nothing here reads the device: the training loop keeps each epoch's values there and hands
them over at its existing host reads (every ``sync_every`` epochs), where the rows are appended
to the CSV and flushed, so an interrupted run leaves whole rows. At the end of a split the CSV
is rewritten once, atomically, with ``lambda_max`` filled in. TensorBoard files need the
``tensorboard`` package (``pip install "dignn-kernels[logs]"``); without it only the CSV is
written. This module imports neither torch nor TensorBoard until a log is opened.
"""
from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

__all__ = ["COLUMNS", "SCALARS", "EpochLogs", "SplitLog", "tensorboard_available",
           "TENSORBOARD_HINT", "read_curves", "split_csv_path"]

COLUMNS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "test_acc",
           "lambda_max", "solver_iterations", "ms_per_epoch")
# The TensorBoard scalars' tags: the columns but the step.
SCALARS = COLUMNS[1:]

TENSORBOARD_HINT = ('TensorBoard files need the tensorboard package: pip install '
                    '"dignn-kernels[logs]"')


def tensorboard_available() -> bool:
    """Whether ``torch.utils.tensorboard`` can write event files here (the ``tensorboard``
    package is installed), found without importing it."""
    import importlib.util
    return importlib.util.find_spec("tensorboard") is not None


def split_csv_path(root: Union[str, os.PathLike], dataset: str, split: int) -> Path:
    """``root/<dataset>/split_<split>.csv``."""
    return Path(root).expanduser() / dataset / f"split_{split}.csv"


def _cell(value) -> str:
    """A CSV cell: an integer as such, a float in full (``repr``), empty for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)


class SplitLog:
    """The log of one split: :meth:`write` appends rows (dicts keyed by :data:`COLUMNS`) to the
    CSV and flushes it, and adds them to the TensorBoard run (``tensorboard``: whether to
    write one); :meth:`finish` fills in ``lambda_max`` at the selected epoch and rewrites the
    CSV atomically; :meth:`close` ends the TensorBoard writer (as :meth:`finish` does)."""

    def __init__(self, csv_path: Path, run_dir: Path, tensorboard: bool):
        self.csv_path, self.run_dir = Path(csv_path), Path(run_dir)
        self.rows: List[Dict] = []
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.csv_path, "w", newline="", encoding="utf-8")
        self._emit([COLUMNS])
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step=1: TensorBoard's reader drops the events of an earlier run in the same
            # folder (a resumed split writes its rows again from epoch 1)
            self._writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=1)

    def _emit(self, rows: Sequence[Sequence]) -> None:
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        self._file.write(text.getvalue())  # one write per sync point, then flushed
        self._file.flush()

    def write(self, rows: Sequence[Dict]) -> None:
        """Appends ``rows`` (each a dict of :data:`COLUMNS`; a missing or NaN value is an
        empty cell and no TensorBoard point)."""
        if not rows:
            return
        self.rows.extend(dict(r) for r in rows)
        self._emit([[_cell(r.get(c)) for c in COLUMNS] for r in rows])
        if self._writer is not None:
            for r in rows:
                for tag in SCALARS:
                    value = r.get(tag)
                    if value is not None and not (isinstance(value, float) and
                                                  math.isnan(value)):
                        self._writer.add_scalar(tag, value, r["epoch"])
            self._writer.flush()

    def finish(self, lambda_max: Optional[float] = None, epoch: Optional[int] = None) -> None:
        """Ends the log: ``lambda_max`` at ``epoch`` (the selected one) into its row and the
        TensorBoard run, the CSV rewritten whole (atomically), the writer closed."""
        if lambda_max is not None and epoch is not None and math.isfinite(lambda_max):
            for r in self.rows:
                if r["epoch"] == epoch:
                    r["lambda_max"] = float(lambda_max)
                    if self._writer is not None:
                        self._writer.add_scalar("lambda_max", float(lambda_max), epoch)
        self._file.close()
        from .files import write_atomically
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(
            [COLUMNS] + [[_cell(r.get(c)) for c in COLUMNS] for r in self.rows])
        data = text.getvalue().encode("utf-8")
        write_atomically(self.csv_path, lambda f: f.write(data))
        self.close()

    def close(self) -> None:
        """Closes the files (the CSV holds every row written so far)."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EpochLogs:
    """Where a run's per-epoch logs go: ``root`` (``--log-dir``); :meth:`split` opens the log
    of one split. ``tensorboard``: write TensorBoard runs too (default: when the package is
    installed).

    Example:
        >>> import tempfile
        >>> from dignn.logs import EpochLogs, read_curves
        >>> with tempfile.TemporaryDirectory() as root:
        ...     log = EpochLogs(root, tensorboard=False).split("csbm", 0)
        ...     log.write([{"epoch": 1, "train_loss": 1.1, "val_acc": 0.5}])
        ...     log.finish()
        ...     curves = read_curves(root)
        >>> [(name, rows[0]["train_loss"]) for name, rows in curves.items()]
        [('csbm/split_0', 1.1)]
    """

    def __init__(self, root: Union[str, os.PathLike], tensorboard: Optional[bool] = None):
        self.root = Path(root).expanduser()
        self.tensorboard = tensorboard_available() if tensorboard is None else bool(tensorboard)

    def split(self, dataset: str, split: int) -> SplitLog:
        """A fresh log of split ``split`` of ``dataset`` (an older one there is replaced)."""
        return SplitLog(split_csv_path(self.root, dataset, split),
                        self.root / dataset / f"split_{split}", self.tensorboard)


def _number(text: str) -> float:
    return math.nan if text.strip() == "" else float(text)


def read_curves(root: Union[str, os.PathLike]) -> Dict[str, List[Dict[str, float]]]:
    """The CSV logs under ``root`` (``--log-dir``), as ``{"<dataset>/split_<k>": [row, ...]}``
    in name order, each row a dict of :data:`COLUMNS` (NaN for an empty cell). A file whose
    header is not :data:`COLUMNS`' is skipped; a row cut short (a run killed while writing)
    ends its file's rows.

    Raises:
        ValueError: ``root`` is not a folder, or holds no log with a row.
    """
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ValueError(f"{str(base)!r} is not a folder; give the --log-dir of a dignn train "
                         f"run (it holds <dataset>/split_<k>.csv)")
    found: Dict[str, List[Dict[str, float]]] = {}
    paths = sorted(base.glob("split_*.csv")) + sorted(base.glob("*/split_*.csv"))
    for path in paths:
        try:
            with open(path, newline="", encoding="utf-8") as f:
                lines = list(csv.reader(f))
        except (OSError, UnicodeDecodeError):
            continue
        if not lines or tuple(lines[0]) != COLUMNS:
            continue
        rows = []
        for cells in lines[1:]:
            if len(cells) != len(COLUMNS):
                break
            try:
                rows.append({c: _number(v) for c, v in zip(COLUMNS, cells)})
            except ValueError:
                break
        if rows:
            name = path.stem if path.parent == base else f"{path.parent.name}/{path.stem}"
            found[name] = rows
    if not found:
        raise ValueError(f"no per-epoch logs in {str(base)!r}: no <dataset>/split_<k>.csv with "
                         f"rows there; write them with dignn train --log-dir {str(base)!r}")
    return found
