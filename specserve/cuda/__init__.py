"""The CUDA fast path: decode and verify steps replayed as CUDA graphs over static input buffers.

plan.py     which token counts are captured and how a step is padded up to one (plain Python)
buffers.py  the preallocated inputs of a static step, filled from the runner's lists with padding
ops.py      the fused element-wise ops of a static step (Triton on CUDA, torch references elsewhere)
forward.py  the Llama forward over the buffers: a fixed sequence of kernels, capturable
graphs.py   capturing that forward at each token count (one memory pool, largest first)
linear.py   batch-invariant projections (one Triton tiling for every row count)
eagle_graph.py   EAGLE's greedy chains and its other passes as graphs
draft_graph.py   a standalone draft model's passes as graphs
rounds.py   greedy decode rounds on the GPU, several steps a host sync
engine/graph_runner.py  GraphModelRunner: replays a captured graph for decode/verify steps, eager otherwise

Graphs are keyed by the step's token count, as vLLM's CUDA-graph runner keys uniform decode
batches by num_tokens = batch x (1 + K): attention reads every token's own sequence, limit and tree
row from the buffers, so any mix of chains and trees of up to MAX_GRAPH_Q tokens per sequence
fits the graph of the next captured size. Prefill and mixed steps run eagerly.
"""
