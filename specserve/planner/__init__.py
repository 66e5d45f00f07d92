"""Multi-model serving planner (AlpaServe): cost model, workloads, discrete-event simulator, placement.

Plain Python + numpy (no torch), except the real-execution runner. Work in progress (issue 3).
"""
