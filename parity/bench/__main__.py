"""``python -m parity.bench`` (``make bench``): see :mod:`parity.bench.kernels`."""
import sys

from .kernels import main

if __name__ == "__main__":
    sys.exit(main())
