"""The C++ sources read as layers: the attention library (include/relpos/*.hpp,
src/backend, src/position, src/schemes, src/attention) includes nothing of the
byte-level model (include/relpos/nn, src/nn) or of the trainer (include/relpos/train,
src/train), and the model nothing of the trainer. Read from the #include lines, each
resolved to the file it names, so a new backward include fails here by name."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Quoted includes, and angle-bracket ones of relpos's own headers.
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(relpos/[^>]+)>)', re.MULTILINE)

# Each layer, and the layers above it that it must not include.
ATTENTION = ["include/relpos/*.hpp", "src/backend/*", "src/position/*", "src/schemes/*", "src/attention/*"]
MODEL = ["include/relpos/nn/*", "src/nn/*"]
TRAINER = ["include/relpos/train/*", "src/train/*"]
FORBIDDEN = [("the attention library", ATTENTION, MODEL + TRAINER), ("the model", MODEL, TRAINER)]


def files(patterns):
    return {p.resolve() for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()}


def included(source: Path):
    """The files a source's includes name: beside it first, then under include/, then from
    the repository's root (on the library's private include path)."""
    for quoted, angled in INCLUDE.findall(source.read_text()):
        name = quoted or angled
        for base in (source.parent, ROOT / "include", ROOT):
            if (base / name).is_file():
                yield name, (base / name).resolve()
                break


@pytest.mark.parametrize("layer, sources, above", FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_no_include_reaches_a_layer_above(layer, sources, above):
    assert files(sources), f"no sources found for {layer}"
    higher = files(above)
    wrong = [f"{s.relative_to(ROOT)} includes {name}" for s in sorted(files(sources)) for name, target in included(s)
             if target in higher]
    assert not wrong, f"{layer} depends on a layer above it: " + "; ".join(wrong)


def test_the_reader_sees_a_backward_include(tmp_path, monkeypatch):
    """The check itself: a source in src/schemes including the model is reported."""
    fake = tmp_path / "src" / "schemes" / "bad.hpp"
    fake.parent.mkdir(parents=True)
    (tmp_path / "include" / "relpos" / "nn").mkdir(parents=True)
    (tmp_path / "include" / "relpos" / "nn" / "model.hpp").write_text("")
    fake.write_text('#include "relpos/nn/model.hpp"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="bad.hpp includes relpos/nn/model.hpp"):
        test_no_include_reaches_a_layer_above(*FORBIDDEN[0])
