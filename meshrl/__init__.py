"""meshrl: RLHF on any device mesh, with per-call placement and parallelism chosen by a cost model."""

__version__ = "0.1.0"
