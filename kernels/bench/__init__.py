"""kernels.bench: the command-line benchmarks and the profiler, one module per chapter that measures a grid.

    python3 -m kernels.bench                 every attention variant beside torch SDPA (notebook 07; attention.py)
    python3 -m kernels.bench.decode          decoding over a KV cache (notebook 08)
    python3 -m kernels.bench.varlen          a BERT-style layer padded and packed (notebook 09)
    python3 -m kernels.bench.sampling        the sampling kernels beside plain torch (notebook 10)
    python3 -m kernels.bench.triton          the Triton kernels beside SDPA and flash2_mma (notebook 11)
    python3 -m kernels.bench.torch_ops       the backward kernels and the PyTorch operators (notebook 12)
    python3 -m kernels.bench.ncu             Nsight Compute stall profiles (notebooks 06 and 13)

Each writes its numbers to results/ as JSON; the notebooks show a few shapes live and plot the stored runs.
"""
