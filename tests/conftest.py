"""Shared test settings: single-threaded torch so several gloo ranks share 2 cores fairly, and the
strict communication mode (meshrl/parallel/comm.py) on, inherited by every spawned rank: a tensor
off the compute device on the data plane, or an object on a data-plane group, fails the test."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MESHRL_STRICT_COMM", "1")
