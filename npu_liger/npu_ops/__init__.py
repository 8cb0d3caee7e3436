"""What runs: ``@triton.jit`` kernels and their host launchers, one file per op. No torch.library here."""
