"""How far a rounding-level change moves a trained accuracy: ``dignn train``'s node-task split
loop with the model's first weight matrix (``lin_in.weight``) multiplied by (1 + 2^-23) after
initialization, everything else as the preset (random-number use unchanged). Comparing its
per-split test accuracy with the unperturbed run's measures the run-to-run spread that
training amplifies from float32 rounding (two backends, or two loops, differ by that much).

    OMP_NUM_THREADS=1 python bench/accuracy/training_noise.py cora cpu 0,1,2,3,4,5,6,7,8,9 \\
        ../shared/data cache out.json
"""
import json
import sys

import torch

import dignn.training as training
from dignn.data import load_dataset
from dignn.presets import preset_config


def main(dataset, backend, splits, data_root, cache_dir, out_path):
    torch.set_num_threads(1)
    build_model = training.build_model

    def perturbed(ds, cfg):
        model = build_model(ds, cfg)
        with torch.no_grad():
            model.lin_in.weight.mul_(1 + 2.0 ** -23)
        return model

    training.build_model = perturbed
    ds = load_dataset(dataset, data_root, cache_dir)
    cfg = preset_config(dataset, "neural", "tuned", backend=backend)
    out = []
    for split in splits:
        r = training.train_node_split(ds, cfg, split, progress=False)
        out.append(dict(split=split, test=r.test_acc, val=r.val_acc, best=r.best_epoch,
                        lam=r.lambda_max_end))
        print(out[-1], flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    name, backend, split_list, root, cache, path = sys.argv[1:7]
    main(name, backend, [int(v) for v in split_list.split(",")], root, cache, path)
