"""Milliseconds per training epoch of `dignn train` (train step + evaluation forward), per
dataset and backend, on the device of --device: what a user of the command waits for.

Each (dataset, backend) pair runs `dignn train --preset paper --splits 0` twice in this
process: a few epochs to warm up (cuBLAS handles, Triton's JIT), then the measured run, whose
JSON record (device, torch, backend, ms per epoch) is kept. Datasets whose files are not under
$DIGNN_DATA are skipped and listed. Writes OUT/gpu_<device>_epochs.json and prints a table.

    python bench/gpu/gpu_epochs.py --out bench/results [--device cuda] [--epochs 100]
        [--datasets cora,chameleon,amherst41,cornell5,penn94-synthetic]
        [--backends auto,cuda,triton] [--compile]
"""
import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from dignn import cli

DATASETS = "cora,chameleon,amherst41,cornell5,penn94-synthetic"


def _run(argv):
    """cli.main(argv) with its output captured: (return code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exit_:  # argparse: an unknown dataset name
            rc = exit_.code
    return rc, out.getvalue(), err.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the JSON")
    ap.add_argument("--device", default="cuda", help="device (default cuda)")
    ap.add_argument("--epochs", type=int, default=100, help="measured epochs (default 100)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up epochs (default 3)")
    ap.add_argument("--datasets", default=DATASETS, help=f"default {DATASETS}")
    ap.add_argument("--backends", default="auto,cuda,triton", help="default auto,cuda,triton")
    ap.add_argument("--compile", action="store_true", help="also time --compile (auto)")
    args = ap.parse_args(argv)
    data_root = os.environ.get("DIGNN_DATA")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, skipped = [], {}
    variants = [(b, False) for b in args.backends.split(",")]
    if args.compile:
        variants.append(("auto", True))
    for name in args.datasets.split(","):
        for backend, compiled in variants:
            common = ["train", "--dataset", name, "--preset", "paper", "--splits", "0",
                      "--device", args.device, "--backend", backend, "--no-progress"]
            common += ["--compile"] if compiled else []
            common += ["--data-root", data_root] if data_root else []
            start = time.perf_counter()
            rc, _, err = _run(common + ["--epochs", str(args.warmup)])
            if rc != 0:
                skipped[f"{name}/{backend}"] = err.strip().splitlines()[-1] if err else rc
                print(f"{name:<18} {backend:<7} skipped: {skipped[f'{name}/{backend}']}",
                      flush=True)
                if "error" in str(skipped[f"{name}/{backend}"]) and backend == "auto":
                    break  # the dataset itself is missing: no other backend will load it
                continue
            # the run's record, outside OUT: a device call sends back at most 8 files
            with tempfile.TemporaryDirectory() as scratch:
                record_path = Path(scratch, "record.json")
                rc, stdout, err = _run(common + ["--epochs", str(args.epochs), "--json",
                                                 str(record_path)])
                record = json.loads(record_path.read_text())
            row = {"dataset": name, "backend_asked": backend, "compiled": compiled,
                   "backend": record["backend"], "ms_per_epoch": record["ms_per_epoch"],
                   "epochs": args.epochs, "test_acc_split0": record["test_acc"][0],
                   "wall_seconds_with_warmup": round(time.perf_counter() - start, 1),
                   "device_name": record["device_name"], "torch": record["torch"]}
            rows.append(row)
            print(f"{name:<18} {backend:<7}{' compiled' if compiled else '':<9} "
                  f"{row['ms_per_epoch']:>8.2f} ms/epoch  backend {','.join(row['backend'])}",
                  flush=True)
            _write(out, rows, skipped, args, argv)  # after every row: a timeout keeps them
    print(f"wrote {_write(out, rows, skipped, args, argv)}")
    return 0 if rows else 1


def _write(out, rows, skipped, args, argv) -> Path:
    """The JSON of the rows so far (OUT/gpu_<device>_epochs.json); returns its path."""
    device = rows[0]["device_name"] if rows else args.device
    slug = re.sub("[^a-z0-9]+", "_", device.lower().replace("nvidia ", "")).strip("_")
    result = {"device": device, "torch": rows[0]["torch"] if rows else None,
              "command": "python bench/gpu/gpu_epochs.py " + " ".join(argv or sys.argv[1:]),
              "settings": "dignn train --preset paper (tables 6/7) --splits 0, "
                          f"{args.epochs} epochs after {args.warmup} warm-up epochs",
              "rows": rows, "skipped": skipped}
    path = out / f"gpu_{slug}_epochs.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
