"""Past one process: a placement's replicas served as Ray actors behind one OpenAI endpoint.

    specserve serve --placement plan.json      # plan.json: the models and where their replicas go

placement.py reads and checks the placement (plain Python); replica.py is what each Ray actor runs (an
AsyncLLM of its own); router.py is the server side: one AsyncLLM-like object per served model that
sends each request to the replica with the fewest requests in flight (then the least KV in use),
streams its deltas back, and turns a replica that died into a clean error for its own requests only.
Ray is imported only here and only when a placement is served (`pip install specserve[cluster]`).
"""
