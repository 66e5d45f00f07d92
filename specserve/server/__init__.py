"""The OpenAI-compatible server (`specserve serve`): app.py builds the app, routes/ holds the routes,
serving.py and choices.py what the generating routes share, protocol.py the request bodies, metrics.py
the Prometheus metrics. It uses the public API only (AsyncLLM, SamplingParams)."""
