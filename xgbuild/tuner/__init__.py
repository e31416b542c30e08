"""Kernel tuning: search spaces, jobs, measurement and the cost model."""
