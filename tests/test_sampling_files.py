"""The two sampling kernel files stand alone, so each carries the few helpers that fix the semantics they share (the
weight of a logit, the ranking, the Philox uniform, top-p on a ranked prefix, the 16-byte loads of a row). Both copies
must stay the same word for word: a change to one that the other misses would make the two top-k methods disagree."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("topk_lists.cu", "threshold.cu")
START = "// What topk_lists.cu and threshold.cu share, in the same words in both"
END = "// (end of what topk_lists.cu and threshold.cu share)"


def shared_block(name: str) -> str:
    text = (ROOT / "kernels" / "sampling" / name).read_text()
    assert text.count(START) == 1 and text.count(END) == 1, f"{name}: the shared block's markers are missing"
    return text[text.index(START):text.index(END)]


def test_the_shared_helpers_are_the_same_in_both_files():
    first, second = (shared_block(name) for name in FILES)
    assert first == second, f"the shared helpers of {FILES[0]} and {FILES[1]} differ: edit both copies alike"
    for helper in ("wexp(", "ranks_before(", "philox_uniform(", "top_p_prefix(", "align_origin(", "load4("):
        assert helper in first, f"the shared block lost {helper}"
