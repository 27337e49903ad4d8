"""Measuring this machine for the planner (``meshrl profile``): matmul and memory bandwidth, layer
fits per width, collectives and point-to-point links, thread scaling, shared cores, pipeline hops,
host time per call, and GPU figures; ``machine.py`` writes them as the JSON profile that
meshrl/plan/hardware_profile.py reads. It runs the model, the parallel code and the runtime, so it
sits above them; the planner reads only its file."""
