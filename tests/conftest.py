"""Shared test settings: single-threaded torch so several gloo ranks share 2 cores fairly (and so
every run of the suite, one rank or many, has the same thread count whatever the machine: the
default train.threads=0 reads $OMP_NUM_THREADS; docs/runtime.md "Determinism"), and the
strict communication mode (meshrl/parallel/comm.py) on, inherited by every spawned rank: a tensor
off the compute device on the data plane, or an object on a data-plane group, fails the test."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MESHRL_STRICT_COMM", "1")
