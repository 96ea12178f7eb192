"""Imports inside the relpos package run one way: the core (schemes, the argument
marshalling, the public API), then relpos.torch's modules in the order below, each
importing only modules before it, at module level (a function-level import of a
relpos module is how an import circle hides). Read from the sources with ``ast``,
nothing imported, so a new module or a backward import fails here by name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCES = Path(__file__).resolve().parents[2] / "python" / "relpos"

# Every module of the package, each allowed to import only those before it.
ORDER = (
    "relpos.schemes",
    "relpos._autograd",  # what the two operator families share: autograd registration, the eager path
    "relpos.gpu.config",  # the GPU path: Triton kernels, needing relpos.schemes alone
    "relpos.gpu.dropout",
    "relpos.gpu.grid",  # positions on a grid and segments in the kernels
    "relpos.gpu.tile_ranges",  # which tiles a program visits
    "relpos.gpu.kernels",
    "relpos.gpu.row_kernels",  # RoPE's rotation, the backward's row dots
    "relpos.gpu.terms",
    "relpos.gpu.launch",
    "relpos.gpu.ops",
    "relpos.gpu.attention",
    "relpos.gpu",
    "relpos.gpu.pipelined",  # the compile check's reading of what Triton pipelined
    "relpos.gpu.compile_check",
    "relpos._calls",
    "relpos",  # the public API: forward, backward, the scheme records
    "relpos.torch.ops",
    "relpos.torch.functional",
    "relpos.torch.context_parallel",
    "relpos.torch.modules",
    "relpos.torch.hf_t5",
    "relpos.torch.hf_deberta",
    "relpos.torch.hf_sam",
    "relpos.torch.hf_swin",
    "relpos.torch",  # re-exports the public names of the modules above
    "relpos.context_parallel",  # README's path to relpos.torch.context_parallel
)
EXTENSION = "relpos._relpos"  # compiled: it imports no Python module of the package


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCES.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(SOURCES.rglob("*.py"))}


def relpos_imports(module: str, source: str, modules) -> list[tuple[str, int, bool]]:
    """(imported relpos module, line, inside a function or class) for each import of
    ``source``; ``from relpos.torch import ops`` imports relpos.torch.ops when that is
    one of ``modules``, ``from relpos import forward`` imports relpos."""
    is_package = any(m.startswith(module + ".") for m in modules)
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def visit(node, nested: bool):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in modules or full == EXTENSION else base, child.lineno, inner))
            visit(child, inner)

    visit(ast.parse(source), False)
    return [(name, line, nested) for name, line, nested in found if name == "relpos" or name.startswith("relpos.")]


def problems(module: str, source: str, order=ORDER) -> list[str]:
    """What in ``source`` (the module ``module``) breaks the one-way order."""
    rank = {name: i for i, name in enumerate(order)}
    found = []
    for target, line, nested in relpos_imports(module, source, rank):
        where = f"{module} line {line}: imports {target}"
        if nested:
            found.append(f"{where} inside a function or class (import it at module level, or move the code)")
        if target == EXTENSION:
            continue
        if target not in rank:
            found.append(f"{where}, which is not in ORDER")
        elif rank[target] >= rank[module]:
            found.append(f"{where}, which comes at or after it in ORDER")
    return found


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """Each module's source -> the modules of ``modules`` it imports."""
    return {m: {t for t, _, _ in relpos_imports(m, s, modules) if t in modules} for m, s in modules.items()}


def circle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``[]`` when there is none."""
    finished, path = set(), []

    def visit(m):
        if m in path:
            return path[path.index(m):] + [m]
        if m not in finished:
            path.append(m)
            for t in sorted(graph[m]):
                found = visit(t)
                if found:
                    return found
            path.pop()
            finished.add(m)
        return []

    return next((found for found in map(visit, sorted(graph)) if found), [])


def test_every_module_has_its_place_in_the_order():
    assert sorted(sources()) == sorted(ORDER)


@pytest.mark.parametrize("module", ORDER)
def test_each_module_imports_only_modules_before_it(module):
    assert problems(module, sources()[module]) == []


def test_the_imports_have_no_circle():
    """Independent of ORDER: the graph of the package's own imports has no cycle."""
    assert circle(import_graph(sources())) == []


def test_the_checks_fail_on_a_backward_hidden_or_circular_import():
    """The checks above can fail: a backward import, a relative one, an unknown module
    and a function-level one are each reported by line; a lazy third-party import is
    not; a circle is found."""
    source = ("import relpos\n"
              "from relpos.torch.modules import RelativeMultiheadAttention\n"
              "from . import hf_t5\n"
              "import relpos.extras\n"
              "def f():\n"
              "    from relpos.torch.ops import encode\n"
              "    import transformers\n")
    found = problems("relpos.torch.functional", source)
    assert len(found) == 4, found
    assert "line 2: imports relpos.torch.modules, which comes at or after" in found[0]
    assert "line 3: imports relpos.torch.hf_t5, which comes at or after" in found[1]
    assert "line 4: imports relpos.extras, which is not in ORDER" in found[2]
    assert "line 6: imports relpos.torch.ops inside a function" in found[3]
    two = {"relpos.a": "from relpos import b\n", "relpos.b": "import relpos.a\n", "relpos.c": "import relpos.b\n"}
    assert circle(import_graph(two)) == ["relpos.a", "relpos.b", "relpos.a"]
