"""The user documents speak of relpos and its measurements only.

README.md stays short enough to read (at most 250 lines), and no user document
(README.md, CONTRIBUTING.md, docs/*.md) names a commit, a working session, a "stop"
or a machine's lending, or speaks of earlier releases or of "this change": a
measurement names its machine by its CPU, and a build by what it contains.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
USER_DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])

FORBIDDEN = {
    # 7 to 40 hex digits with a letter and a digit among them: a commit hash.
    "commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "session": re.compile(r"\bsessions?\b", re.I),
    "a stop (of work)": re.compile(r"\b(this|a later|an earlier|the previous|the next|earlier|later) stop\b", re.I),
    "earlier releases": re.compile(r"\bearlier releases?\b", re.I),
    "a change in time": re.compile(r"\b(before|after|since) (this|that|the) change\b", re.I),
    "a machine's lending": re.compile(r"\blendings?\b|\blent\b", re.I),
}


def test_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_document_has_no_history_words(doc):
    assert doc.exists(), f"{doc.relative_to(ROOT)} is missing"
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(line):
                found.append(f"{doc.name}:{number}: {what}: {match.group(0)!r} in {line.strip()[:100]!r}")
    assert not found, "\n".join(found)


def test_forbidden_patterns_catch_what_they_are_for():
    assert FORBIDDEN["commit hash"].search("the build of c492bb0")
    assert not FORBIDDEN["commit hash"].search("1000000 steps, a cafe, 0x10")
    assert FORBIDDEN["session"].search("on this session's machine")
    assert FORBIDDEN["a stop (of work)"].search("measured at a later stop")
    assert not FORBIDDEN["a stop (of work)"].search("Ctrl-C stops the run; --stop-after N")
    assert FORBIDDEN["a change in time"].search("measured before this change")
    assert FORBIDDEN["a machine's lending"].search("on different lendings of the machine")


def test_headline_plot_matches_the_readme_table():
    """docs/headline_ratios.svg is what bench/plot_headline.py draws from the README's table now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_headline", ROOT / "bench" / "plot_headline.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    machines, rows = plot.headline_table((ROOT / "README.md").read_text())
    assert len(machines) >= 2 and len(rows) >= 4
    assert (ROOT / "docs" / "headline_ratios.svg").read_text() == plot.svg(machines, rows), \
        "run python3 bench/plot_headline.py after changing the README's headline table"
