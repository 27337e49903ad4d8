"""Shared test settings: single-threaded torch so several gloo ranks share 2 cores fairly (and so
every run of the suite, one rank or many, has the same thread count whatever the machine: the
default train.threads=0 reads $OMP_NUM_THREADS; docs/runtime.md "Determinism"), and the
strict communication mode (meshrl/parallel/comm.py) on, inherited by every spawned rank: a tensor
off the compute device on the data plane, or an object on a data-plane group, fails the test; and
hypothesis without its timing checks (below)."""

import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MESHRL_STRICT_COMM", "1")

# Property tests check properties, not how fast their inputs are drawn: on the shared 2-core machine
# a burst of other work made hypothesis's too_slow health check fail test_axes_partition_the_mesh
# ("only generated 2 valid inputs after 1.89 seconds", load average 25). Tests keep their own
# @settings (max_examples); this only turns the timing checks off.
settings.register_profile("shared-cores", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")
