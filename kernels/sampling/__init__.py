"""Chapter 10: from logits to a token: top-k and top-p sampling, Philox draws, the beam-search step."""

from . import sampling  # noqa: F401
