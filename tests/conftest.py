"""Shared test settings: single-threaded torch so several gloo ranks share 2 cores fairly."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
