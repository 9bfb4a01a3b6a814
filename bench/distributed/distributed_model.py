"""A model (not a measurement) of one sweep and of the memory per GPU of the distributed
implicit layer on a graph of ogbn-papers100M's size over 8 GPUs.

Inputs, each named in the output:

- the graph: 111,059,956 nodes, 1,615,685,872 edges, symmetrized to 2 x that many CSR
  entries; h = d = 64, float32;
- the sweep rate of one GPU: the products-sized graph's layer step on an H100 (2,449,029
  nodes, 123,718,280 entries, 10 forward + 10 adjoint sweeps): 369 ms with shuffled ids and
  177 ms with block-ordered ids (cuda backend; bench/results/gpu_h100_2026-11-23/
  locality_products_block_model.json and issue 14's table): a step's time over its 20 sweeps
  gives entries per second, the neural and gradient passes included;
- the halo: the measured halo fractions (halo rows over owned rows, per rank) of 8-part METIS
  and contiguous partitions of the products-sized block models
  (bench/results/distributed_halo.json; papers100M itself is not available here), applied to
  papers100M's owned rows;
- the links: NVLink 4 on an H100 SXM, 450 GB/s per direction per GPU (8 GPUs in one node), and
  InfiniBand NDR, 400 Gb/s = 50 GB/s per GPU (8 nodes of one GPU each, or one HCA per GPU);
  nominal rates, so the exchange times are lower bounds;
- memory: the arrays the implementation allocates, counted per array below and checked
  against the single-GPU figure (a products-sized layer step in 8-9 GB): the solvers' arrays
  over the owned rows, and over the halo rows too (``dignn_kernels.distributed.system``: the
  local CSR is padded square, rows = owned + halo) the received halo rows, the sweep's
  concatenated input, the padded right-hand side, the row pass's output, p and q; beside it
  ("halo rows only where read") what a rectangular local CSR would hold: the received halo
  rows, p and q. 8 GPUs, and 16 for comparison.

    python bench/distributed/distributed_model.py  # writes bench/results/distributed_papers100m_model.json
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NODES = 111_059_956
EDGES = 1_615_685_872
ENTRIES = 2 * EDGES
GPU_COUNTS = (8, 16)
CHANNELS = 64
ROW_BYTES = CHANNELS * 4  # one float32 row of h = d = 64
FEATURE_BYTES = 128 * 4  # papers100M's 128 input features, float32

PRODUCTS_ENTRIES = 123_718_280
STEP_MS = {"shuffled ids": 369.0, "block-ordered ids": 177.0}
SWEEPS_PER_STEP = 20
LINKS_GB_S = {"NVLink 4 (450 GB/s)": 450.0, "InfiniBand NDR (50 GB/s)": 50.0}

# Arrays of the layer's training step, per local row (owned + halo), float32 rows of 64:
# x, z, two fixed-point iterates, p, q, the incoming gradient, two adjoint iterates, v,
# grad_p, grad_q; and chi, kappa, cy, rs (4 bytes each).
LAYER_ROW_ARRAYS = 12
LAYER_ROW_SCALARS = 4
HALO_ARRAYS = {"as implemented": 6, "halo rows only where read": 3}  # n x 64 arrays with halo rows
# Per CSR entry: column (int32), a, w (float32); per row: rowptr (int64).
ENTRY_BYTES = 12
# The model around the layer, per owned row: the input features and about six n x 64
# activations (MLP, batch norm, dropout masks, classifier input).
MODEL_ROW_ARRAYS = 6


def layer_bytes(rows, entries):
    return rows * (LAYER_ROW_ARRAYS * ROW_BYTES + LAYER_ROW_SCALARS * 4 + 8) + \
        entries * ENTRY_BYTES


def memory_gb(owned, halo_rows, entries, halo_arrays):
    """GB per GPU of the model's training step: the layer, the input features and the
    model's activations over the owned rows, and ``halo_arrays`` n x 64 arrays over the halo
    rows."""
    layer = layer_bytes(owned, entries) + halo_rows * halo_arrays * ROW_BYTES
    return (layer + owned * (FEATURE_BYTES + MODEL_ROW_ARRAYS * ROW_BYTES)) / 1e9


def cases(gpus, halo, rates):
    """One case per 8-part partition of a products-sized graph in the halo measurement."""
    owned = NODES / gpus
    local_entries = ENTRIES / gpus
    out = []
    for graph, info in halo["graphs"].items():
        for run in info["runs"]:
            if not graph.startswith("products") or run["parts"] != min(gpus, 8):
                continue
            fraction = max(run["halo_nodes"]) / owned_of(run)
            halo_rows = fraction * owned
            exchange_bytes = halo_rows * ROW_BYTES
            case = {"gpus": gpus, "owned_rows_per_gpu": round(owned),
                    "csr_entries_per_gpu": round(local_entries),
                    "halo_from": f"{graph} ({info['source']}), {run['method']}, "
                                 f"{run['parts']} parts",
                    "halo_rows_over_owned_rows": round(fraction, 3),
                    "halo_rows_per_gpu": round(halo_rows),
                    "exchange_gb_per_sweep_per_gpu": round(exchange_bytes / 1e9, 3),
                    "memory_gb_per_gpu": {
                        k: round(memory_gb(owned, halo_rows, local_entries, arrays), 1)
                        for k, arrays in HALO_ARRAYS.items()},
                    "sweep_ms": {}}
            for order, rate in rates.items():
                compute_ms = local_entries / rate * 1e3
                for link, gb_s in LINKS_GB_S.items():
                    exchange_ms = exchange_bytes / (gb_s * 1e9) * 1e3
                    case["sweep_ms"][f"{order}, {link}"] = {
                        "compute": round(compute_ms, 1), "exchange": round(exchange_ms, 1),
                        "sequential": round(compute_ms + exchange_ms, 1),
                        "overlapped": round(max(compute_ms, exchange_ms), 1)}
            out.append(case)
    return out


def main():
    halo = json.loads((ROOT / "bench/results/distributed_halo.json").read_text())
    rates = {k: PRODUCTS_ENTRIES * SWEEPS_PER_STEP / (ms * 1e-3) for k, ms in STEP_MS.items()}
    check_gb = layer_bytes(2_449_029, PRODUCTS_ENTRIES) / 1e9
    out = {"what": "a model, not a measurement: see bench/distributed/distributed_model.py",
           "graph": {"nodes": NODES, "edges": EDGES, "csr_entries": ENTRIES, "h": CHANNELS},
           "halo_note": "16 GPUs use the 8-part halo fractions (none were measured at 16 "
                        "parts; more parts mean larger fractions, so this is optimistic)",
           "single_gpu_rate_entries_per_s": {k: round(v / 1e9, 2) * 1e9 for k, v in
                                             rates.items()},
           "memory_model_check": f"the same byte model gives {check_gb:.1f} GB for the "
                                 f"products-sized layer step on one GPU (measured: 8-9 GB)",
           "links_gb_per_s": LINKS_GB_S,
           "cases": [c for gpus in GPU_COUNTS for c in cases(gpus, halo, rates)]}
    path = ROOT / "bench/results/distributed_papers100m_model.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def owned_of(run):
    """The owned rows of the rank with the largest halo."""
    k = max(range(len(run["halo_nodes"])), key=lambda r: run["halo_nodes"][r])
    return run["owned_nodes"][k]


if __name__ == "__main__":
    main()
