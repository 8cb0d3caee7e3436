"""GPU benchmark harness for npu-liger: ``python benchmarks/run.py --help``."""
