"""The package's shape: each folder one concern, SGLang named in one folder, no import circle,
small modules, a short package top. Read from the source text (nothing is imported)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tangram_sglang"
NAME = PACKAGE.name


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "shims" in path.parts:  # stand-ins for other packages (sgl_kernel, torchvision)
            continue
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """Package modules ``name`` imports anywhere in its text (lazy imports inside functions too):
    ``from a.b import c`` names a.b.c when that is a module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) - {name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def test_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_sglang_is_named_only_in_its_folder():
    offenders = []
    for name, path in modules().items():
        if name.startswith(f"{NAME}.sglang") or name.startswith(f"{NAME}.cpu_compat"):
            continue  # cpu_compat installs stand-ins for SGLang's kernel package on CPU machines
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{name}: {n}" for n in names if n == "sglang" or n.startswith("sglang.")]
    assert not offenders, offenders


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long, long


def test_package_top_is_a_few_entry_points():
    top = [p.name for p in PACKAGE.glob("*.py")]
    assert len(top) <= 8, top


@pytest.mark.parametrize("folder", ["method", "pool"])
def test_control_plane_imports_no_torch(folder):
    """method/ and pool/ work on integers and numpy; the data plane turns their plans into tensors."""
    heavy = ("torch", "transformers", "triton", "sglang")
    for path in (PACKAGE / folder).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not [n for n in names if n.split(".")[0] in heavy], (path.name, names)
