"""The package's layout rules (issue 42): imports point downward, the serving package carries no
benchmarks, and the layers below the engine never import it. An AST scan of every module's imports
(lazy ones inside functions included)."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "specserve"


def _imports(path: pathlib.Path) -> set[str]:
    """The absolute module names a file imports (relative imports resolved against its package)."""
    mod = path.relative_to(ROOT).with_suffix("").parts
    package = mod[:-1] if path.name != "__init__.py" else mod[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ((node.module,) if node.module else ()))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


def _modules(under: pathlib.Path):
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def _offenders(under: pathlib.Path, forbidden: tuple[str, ...], allowed_dirs: tuple[str, ...] = ()) -> list[str]:
    bad = []
    for p in _modules(under):
        rel = p.relative_to(PKG).as_posix()
        if any(rel.startswith(d) for d in allowed_dirs):
            continue
        hit = sorted(i for i in _imports(p) if any(i == f or i.startswith(f + ".") for f in forbidden))
        if hit:
            bad.append(f"{rel}: {hit[0]}")
    return bad


def test_the_serving_package_does_not_import_the_benchmarks():
    # `specserve bench ...` (the CLI) dispatches to them; nothing else in the package may
    assert _offenders(PKG, ("specserve_bench",), allowed_dirs=("cli/",)) == []


@pytest.mark.parametrize("layer", ["kv", "attention", "kernels", "loading", "models", "sampling", "scheduler",
                                   "ngram", "guided", "cuda", "weights"])
def test_the_layers_below_the_engine_do_not_import_it_or_what_sits_above(layer):
    above = ("specserve.engine", "specserve.server", "specserve.cli", "specserve.planner", "specserve.training",
             "specserve.speculative", "specserve.drafters")
    assert _offenders(PKG / layer, above) == []


def test_the_imports_found_are_real():
    """The scan itself: it sees a relative import two levels up and a lazy one inside a function."""
    got = _imports(PKG / "drafters" / "ngram.py")
    assert "specserve.training.ngram" in got or "specserve.training.ngram.build_ngram" in got
