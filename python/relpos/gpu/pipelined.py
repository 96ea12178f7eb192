"""Which loads of a compiled kernel Triton pipelined, by the source lines they come from.

Why: the dq kernel adds to a program's own float32 sums in global memory (a table's gradient
per row, kernels._rows_grad and kernels._add_end_rows; a grid's, grid._add): it loads a row,
adds and stores it, then a barrier orders that store before another thread's load of the
same row in the next tile. That is only safe while those loads run where the code puts them.
Triton's software pipeliner turns a loop's loads into asynchronous copies issued one or more
iterations ahead (``ttg.async_copy_global_to_local`` in the TTGIR, TMA copies on sm_90);
such a copy of a sum's row would read it before the previous tile's store, and the gradient
would lose that tile. Triton 3.6 pipelines none of these loads (it pipelines no loop that
holds a barrier), but a pipeliner that did would not say so: the compile check
(compile_check.py) counts, per specialisation, the asynchronous copies located in the
functions above and fails on any.

How: every TTGIR operation carries a location; a location is a file and line, a call site
(the callee's location ``at`` the caller's), or a name around another. An operation's own
line is the innermost location's: a load written in _rows_grad is located there whatever
kernel inlined it, and a load in a helper _rows_grad calls is located in that helper.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Iterable, Optional

from . import grid, kernels

__all__ = ["ASYNC_COPY", "IN_PLACE_SUMS", "own_lines", "copies_in"]

# the functions that load, add to and store back a program's own sums in global memory (a load counts where
# its code is written: a new function that adds in place belongs here)
IN_PLACE_SUMS = (kernels._rows_grad, kernels._add_end_rows, grid._add)

# an asynchronous global-to-shared copy (cp.async, or a TMA copy on sm_90) and its location
ASYNC_COPY = re.compile(r"=\s*\S*\.async\w*_copy_global_to_local\b.*\bloc\((#loc\d*)\)\s*$", re.M)
_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$", re.M)
_FILE_LINE = re.compile(r'^"([^"]*)":(\d+):\d+')
_CALLSITE = re.compile(r"^callsite\((#loc\d*) at ")
_NAMED = re.compile(r'^"[^"]*"\((#loc\d*)\)$')


def own_lines(ttgir: str) -> dict[str, Optional[tuple[str, int]]]:
    """Each location alias of ``ttgir`` (``#loc12``) mapped to its own (file, line), None where it has
    none (an unknown location)."""
    bodies = dict(_LOC_DEF.findall(ttgir))
    resolved: dict[str, Optional[tuple[str, int]]] = {}

    def resolve(alias: str, depth: int = 0) -> Optional[tuple[str, int]]:
        if alias in resolved:
            return resolved[alias]
        body, place = bodies.get(alias, ""), None
        if (m := _FILE_LINE.match(body)):
            place = (_module_file(m.group(1)), int(m.group(2)))
        elif depth < 64 and (m := _CALLSITE.match(body) or _NAMED.match(body)):
            place = resolve(m.group(1), depth + 1)
        resolved[alias] = place
        return place

    for alias in bodies:
        resolve(alias)
    return resolved


def _module_file(path: str) -> str:
    """A source file by its last three path parts (relpos/gpu/kernels.py): Triton's cache keys a
    compile by the source, not its path, so a cached TTGIR may name the copy of the same file
    that first compiled it (another checkout, another virtual environment)."""
    return "/".join(Path(path).parts[-3:])


def _span(fn) -> tuple[str, range]:
    """The file and lines of a Triton JIT function's source."""
    py = getattr(fn, "fn", fn)
    lines, first = inspect.getsourcelines(py)
    return _module_file(inspect.getsourcefile(py)), range(first, first + len(lines))


def copies_in(ttgir: str, functions: Iterable) -> int:
    """How many asynchronous copies of ``ttgir`` are located in the source of ``functions``."""
    spans = [_span(f) for f in functions]
    places = own_lines(ttgir)
    count = 0
    for alias in ASYNC_COPY.findall(ttgir):
        place = places.get(alias)
        count += place is not None and any(place[0] == f and place[1] in lines for f, lines in spans)
    return count

