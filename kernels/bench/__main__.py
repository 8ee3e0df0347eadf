"""`python3 -m kernels.bench`: the attention benchmark (kernels/bench/attention.py)."""

import sys

from .attention import main

sys.exit(main())
