"""Chapter 14: attention across GPUs. The sequence is cut over the ranks of a torch.distributed group; each rank
attends its queries to one block of keys at a time and merges the partials by their log-sum-exp.

    schedule.py    which chunks each rank holds (contiguous, zigzag) and what it computes at each ring step; work
                   and message counts (pure Python: notebook 14 draws and counts from it)
    local.py       the local attention the algorithm is written against, its two backends (float64 reference on
                   CPU, the course's CUDA kernels on GPU), and the merge by LSE
    context.py     ring, zigzag and all-to-all (Ulysses), forward and backward; shard/unshard; the input checks
    selfcheck.py   every schedule run on real processes against the float64 reference
                   (python3 -m kernels.parallel.selfcheck [--world N] | torchrun ... --backend cuda)

The benchmark is kernels/bench/context_parallel.py. Importing this folder imports only schedule.py (no torch);
import context, local or selfcheck yourself where torch is installed.
"""

from . import schedule

__all__ = ["schedule"]
