"""Multi-model serving planner (AlpaServe, Li et al. OSDI 2023).

  models.py      the model table (V100 latencies, weight sizes), sets S1-S4, cluster specs
  workload.py    seeded Poisson / Gamma(rate, CV) arrivals, CSV trace replay
  cost_model.py  stage latency and memory per (pp, op): analytic, or measured (`specserve profile`)
  simulator.py   the discrete-event simulator (a numba event loop)
  reference.py   a plain-Python heap simulator the numba loop must match request for request (tests)
  placement.py   groups with a parallel configuration and their models; memory checks
  search.py      AlpaServe's placement search; selective replication and round-robin baselines
  sweep.py       attainment vs rate / CV / SLO scale / devices; the two-model example
  llm.py         LLM mode: generations, continuous batching, TTFT/TPOT SLOs, KV memory, drafts priced per step
  llm_search.py  speculation-aware placement: a draft beside its target vs another replica
  real/          the only torch part: profiling, pipeline stages on torch.distributed processes
"""
