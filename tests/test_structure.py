"""The package's structure: the import graph (no cycle between subpackages; ops/ imports nothing
from runtime/, models/, bench/, commands/ or server/) and the one reader of MINFER_* switches."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "minfer"
SUBPACKAGES = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _imports(path: Path) -> set[str]:
    """Every minfer module a file imports, at any level (function-level imports included)."""
    tree = ast.parse(path.read_text())
    out = set()
    pkg = ".".join(("minfer",) + path.relative_to(ROOT).parent.parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("minfer")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("minfer"):
                out.add(mod)
                out |= {f"{mod}.{a.name}" for a in node.names}   # `from minfer import ops`
    return out


def _unit(mod: str) -> str | None:
    """The subpackage a module belongs to (None for top-level modules such as minfer.config)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else None


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {s: set() for s in SUBPACKAGES}
    for path in ROOT.rglob("*.py"):
        src = _unit(".".join(("minfer",) + path.relative_to(ROOT).with_suffix("").parts))
        if src is None:
            continue
        for mod in _imports(path):
            dst = _unit(mod)
            if dst is not None and dst != src:
                g[src].add(dst)
    return g


def test_ops_imports_nothing_from_the_layers_above():
    bad = []
    for path in (ROOT / "ops").rglob("*.py"):
        for mod in _imports(path):
            if _unit(mod) in ("runtime", "models", "bench", "commands", "server"):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {mod}")
    assert not bad, bad


def _check_cycle(g: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(n, stack):
        state[n] = 1
        for m in sorted(g[n]):
            if state.get(m) == 1:
                pytest.fail(f"import cycle: {' -> '.join(stack + [n, m])}")
            if m not in state:
                visit(m, stack + [n])
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [])


def test_no_import_cycle_between_subpackages():
    g = _graph()
    assert {"ops", "models", "runtime"} <= set(g) and "ops" in g["models"]   # the walk saw the package
    _check_cycle(g)


def test_the_cycle_check_can_fail():
    with pytest.raises(pytest.fail.Exception, match="import cycle: a -> b -> a"):
        _check_cycle({"a": {"b"}, "b": {"a"}})


ENV_READ = re.compile(r"os\.environ|getenv")
# The documented process-level reads besides minfer/switches.py (see its module docstring).
ALLOWED_ENV = {
    "switches.py",                 # Switches.from_env: every MINFER_* behaviour variable
    "process_env.py",              # moved out of switches.py: retired switches, the record's MINFER_* snapshot,
                                   # process_setting (MINFER_COMMIT)
    "catalog.py",                  # MINFER_HOME, MINFER_PIP_ARGS (where models live, how pip runs)
    "ops/cuda/dequant.py",         # TRITON_INTERPRET (Triton's own switch)
    "commands/serve.py",           # MINFER_API_KEY, the server's default key
    "cli.py",                      # writes OMP_WAIT_POLICY (torch's OpenMP), reads no MINFER_* variable
    "bench/qgemm_sweep.py",        # --smoke sets TRITON_INTERPRET (Triton's own switch) for a CPU check
}


def test_environment_is_read_in_the_documented_places_only():
    readers = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ENV_READ.search(p.read_text())}
    assert readers <= ALLOWED_ENV, sorted(readers - ALLOWED_ENV)


def test_architecture_lists_come_from_the_registry():
    """minfer.models.ARCHITECTURES is the one list: config accepts exactly it, and the tools that
    support a subset (synthetic files, the torch peer) name only registered architectures."""
    from minfer.bench.peers import PEER_ARCHS
    from minfer.bench.synth import SYNTH_ARCHS
    from minfer.models import ARCHITECTURES, Model

    assert set(PEER_ARCHS) <= set(ARCHITECTURES) and set(SYNTH_ARCHS) <= set(ARCHITECTURES)
    for arch, cls in ARCHITECTURES.items():
        assert issubclass(cls, Model) and cls.arch == arch and cls.rope_style in ("normal", "neox")
    import minfer.config
    import minfer.gguf_file

    assert not hasattr(minfer.config, "SUPPORTED_ARCHS") and not hasattr(minfer.gguf_file, "SUPPORTED_ARCHS")
