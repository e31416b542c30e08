"""Engine execution: loader, executors (CPU reference, CUDA), checks, distributed."""
