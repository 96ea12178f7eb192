"""Draws the README's headline table of measured ratios as an SVG.

    python3 bench/plot_headline.py [--readme README.md] [--out docs/headline_ratios.svg]

Reads the table that starts with "| relpos vs SDPA" from the README itself (so the
plot cannot disagree with it) and draws one horizontal bar per row (named by its
first words), mode and machine: from the lowest to the highest ratio measured (a single value is a short
tick), with the 1x line where relpos and PyTorch's SDPA take the same time.
Standard library only.
"""
import argparse
import re
from pathlib import Path

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def headline_table(readme: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    lines = [line for line in readme.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("| relpos vs SDPA"))
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    header = cells(lines[start])
    modes = [m.strip() for m in header[0].removeprefix("relpos vs SDPA,").split("/")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        case, *values = cells(line)
        for k, mode in enumerate(modes):
            parts = [v.split(" / ") for v in values]
            if all(len(p) > k for p in parts):
                rows.append((f"{re.split(r',| [(]', case)[0]}: {mode}", [p[k] for p in parts]))
    return header[1:], rows


def value_range(text: str) -> tuple[float, float]:
    numbers = [float(x) for x in re.findall(r"\d+\.\d+", text)]
    return min(numbers), max(numbers)


def svg(machines: list[str], rows: list[tuple[str, list[str]]]) -> str:
    label_w, plot_w, bar_h, gap, top = 250, 440, 7, 10, 40
    row_h = bar_h * len(machines) + gap
    height = top + row_h * len(rows) + 30 + 16 * len(machines)
    x_max = max(value_range(v)[1] for _, values in rows for v in values)
    x_max = float(int(x_max) + 1)
    x = lambda r: label_w + plot_w * r / x_max
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 20}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="16" font-size="13">relpos speed ratio against PyTorch SDPA (above 1x: relpos faster)</text>']
    for tick in range(int(x_max) + 1):
        out.append(f'<line x1="{x(tick)}" y1="{top - 8}" x2="{x(tick)}" y2="{top + row_h * len(rows)}" '
                   f'stroke="{"#000" if tick == 1 else "#ddd"}"/>')
        out.append(f'<text x="{x(tick)}" y="{top - 12}" text-anchor="middle">{tick}x</text>')
    for i, (label, values) in enumerate(rows):
        y0 = top + i * row_h
        out.append(f'<text x="{label_w - 8}" y="{y0 + row_h / 2 - 1}" text-anchor="end">{label}</text>')
        for m, value in enumerate(values):
            lo, hi = value_range(value)
            y = y0 + m * bar_h
            out.append(f'<rect x="{x(lo) - 1}" y="{y}" width="{max(x(hi) - x(lo), 0) + 2}" height="{bar_h - 1}" '
                       f'fill="{COLOURS[m % len(COLOURS)]}"><title>{value}</title></rect>')
    for m, machine in enumerate(machines):
        y = top + row_h * len(rows) + 20 + 16 * m
        out.append(f'<rect x="{label_w}" y="{y - 9}" width="10" height="10" fill="{COLOURS[m % len(COLOURS)]}"/>')
        out.append(f'<text x="{label_w + 16}" y="{y}">{machine}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", default=root / "README.md", type=Path)
    parser.add_argument("--out", default=root / "docs" / "headline_ratios.svg", type=Path)
    args = parser.parse_args()
    machines, rows = headline_table(args.readme.read_text())
    args.out.write_text(svg(machines, rows))
    print(f"{args.out}: {len(rows)} rows x {len(machines)} machines")


if __name__ == "__main__":
    main()
