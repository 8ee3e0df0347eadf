"""Showing kernel source to a reader: a whole file, one function of it, or one function cut into its steps.

Notebooks show kernels through these, so the code a learner reads is the code that runs.
"""

from __future__ import annotations

import re

from .compile import kernel_path


def kernel_source(filename: str, name: str | None = None) -> str:
    """The text of the kernel file `filename` (a bare name: "flash2_mma.cu"), or of one function in it (from its signature to its closing brace).

    Notebooks show kernels through this, so the code a learner reads is the code that runs. The comment
    block right above the function comes with it.
    """
    text = kernel_path(filename).read_text()
    if name is None:
        return text
    # the first line that calls or declares name( outside a comment and a preprocessor line (a #define whose comment
    # mentions "name (" is neither)
    m = re.search(r"^(?![ \t]*(?://|/\*|\*|#))[^\n;{}/]*\b" + re.escape(name) + r"\s*\(", text, re.M)
    if m is None:
        raise ValueError(f"no function {name!r} in {filename}")
    start = m.start()
    before = text[:start].rstrip("\n").split("\n")
    lead = []
    while before and before[-1].lstrip().startswith(("//", "template", "extern", "__global__", "__device__")):
        lead.insert(0, before.pop())
    brace = text.index("{", m.end())
    depth, i = 0, brace
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return "\n".join(lead + [text[start : i + 1]])


STEP_MARK = re.compile(r"^\s*// ---- (.+?)\s*-*\s*$")


def kernel_steps(filename: str, name: str) -> list[tuple[str, str]]:
    """One function of the kernel file `filename`, cut into its steps: [(title, code), ...].

    A step starts at a comment line of the form `// ---- title -----`; what comes before the first one is the
    signature and set-up. Notebooks show a long kernel this way, a step at a time with the explanation between.
    """
    steps, title, lines = [], "signature and set-up", []
    for line in kernel_source(filename, name).split("\n"):
        m = STEP_MARK.match(line)
        if m and lines:
            steps.append((title, "\n".join(lines)))
            title, lines = m.group(1), []
        lines.append(line)
    steps.append((title, "\n".join(lines)))
    return steps
