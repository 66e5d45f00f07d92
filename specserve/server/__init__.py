"""The OpenAI-compatible server (`specserve serve`): app.py routes, protocol.py request bodies,
metrics.py Prometheus metrics. It uses the public API only (AsyncLLM, SamplingParams)."""
