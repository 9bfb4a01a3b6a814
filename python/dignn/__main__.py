"""``python -m dignn``: the ``dignn`` command (:func:`dignn.cli.main`), e.g. under
``torchrun --nproc-per-node N -m dignn train --distributed ...``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
