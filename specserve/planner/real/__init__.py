"""Real execution of placements: pipeline stages of the embedded model on processes joined by
torch.distributed (gloo on CPU, nccl on GPU), the layer profiler behind the measured cost model, and
the replay that checks the simulator against them. The only part of `planner` that imports torch."""
