"""Writes python/relpos/scheme_options.json: every scheme's options (name, kind,
default, range, choices) as the C++ schemes declare them (for_each_option in
src/schemes/), which the Python records read (relpos/schemes.py). Run it after
changing an option in src/schemes/ and rebuilding (`pip install .`, which
setup.sh runs):

    .venv/bin/python scripts/scheme_options.py [path/to/_relpos*.so]

It reads the compiled extension (by default the installed relpos's) without
importing the relpos package, which needs the file. tests/python/test_scheme_options.py
fails while the file and the extension disagree."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "python" / "relpos" / "scheme_options.json"


def text(options: dict) -> str:
    """The file's text for the extension's table."""
    return json.dumps(options, indent=1) + "\n"


def extension(path: str | None):
    """The compiled module at ``path``, or the installed relpos's, loaded on its own."""
    if path is None:
        package = importlib.util.find_spec("relpos")  # finds it without running its __init__
        if package is None or not package.submodule_search_locations:
            sys.exit("relpos is not installed: give the path of _relpos*.so")
        folder = Path(package.submodule_search_locations[0])
        found = [folder / f"_relpos{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
        found = [f for f in found if f.exists()]
        if not found:
            sys.exit(f"no _relpos extension for this Python in {folder}")
        path = str(found[0])
    spec = importlib.util.spec_from_file_location("_relpos", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    TABLE.write_text(text(extension(sys.argv[1] if len(sys.argv) > 1 else None).scheme_options()))
    print(f"wrote {TABLE}")
