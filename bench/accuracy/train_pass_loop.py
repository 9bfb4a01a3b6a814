"""``dignn train`` with the compiled CPU backend's fused C++ loop turned off, so that a float32
run takes the solvers' Python loop over the same CPU passes that a 16-bit run
(``--storage-dtype``) takes: comparing the two isolates the storage from the loop (the fused
loop and the Python loop stop differently on a diverging solve, see
``dignn_kernels.solvers.loops.fixed_point``).

    OMP_NUM_THREADS=1 python bench/accuracy/train_pass_loop.py train --dataset cornell5 \\
        --data-root ../shared/data --threads 1 --json cornell5_pass_loop.json
"""
import dataclasses
import sys

from dignn_kernels import backends

backends._REGISTRY["cpu"] = dataclasses.replace(backends._REGISTRY["cpu"], fused_solve=None)

from dignn.cli import main  # noqa: E402  (after the backend is replaced)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
