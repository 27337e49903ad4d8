"""Pure rank and shard math: ``Mesh``, ``Layout``, ``Placement`` (mesh.py), ``ShardMap``
(shardmap.py) and ``ReallocPlan`` (realloc_plan.py). No torch.distributed: the planner, the parallel
model and the reallocation executor all import it, and it imports none of them."""
