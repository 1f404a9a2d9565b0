"""llama.cpp's tokenizer test suite, fetched from the llama-cpp-python source archive.

The `llama-cpp-python` 0.3.36 sdist vendors llama.cpp (ggml-org/llama.cpp@0c1e57098); its
`vendor/llama.cpp/models/` holds vocab-only GGUF files `ggml-vocab-<name>.gguf`, and for 15
of them the texts `.inp` (split by a line `__ggml_vocab_test__`) and the ids `.out` (one line
per text) that llama.cpp's tests/test-tokenizer-0.cpp checks with
common_tokenize(add_special=false, parse_special=false).

`suite_dir()` downloads the archive once with `pip download` (PyPI is the only registry these
machines reach), checks its sha256, and extracts only those files, plus the vocab files of
EXTRA (no .inp/.out), into $MINFER_HOME/llama.cpp-0.3.36/models (about 67 MB); later calls
reuse them.

    python tools/fetch_llama_cpp.py          # fetch (if needed) and print the folder
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SPEC = "llama-cpp-python==0.3.36"
ARCHIVE = "llama_cpp_python-0.3.36.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # measured 2026-11-30
MEMBER_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
# the vocabularies with .inp/.out (tests/CMakeLists.txt: the test-tokenizer-0 targets)
SUITE = ("bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
         "gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact",
         "starcoder")
# vocab-only files without .inp/.out that tests read directly: nomic-bert-moe holds XLM-RoBERTa's
# 250k SentencePiece Unigram vocab (tokenizer.ggml.model 't5'; tests/tokenizer/test_tok_ugm.py)
EXTRA = ("nomic-bert-moe",)
SEP = "\n__ggml_vocab_test__\n"


def _home() -> Path:
    return Path(os.environ.get("MINFER_HOME", Path.home() / ".cache" / "minfer"))


def _complete(out: Path) -> bool:
    return all((out / f"ggml-vocab-{n}.gguf.out").is_file() for n in SUITE) and \
        all((out / f"ggml-vocab-{n}.gguf").is_file() for n in EXTRA)


def suite_dir() -> Path:
    """The folder holding ggml-vocab-<name>.gguf{,.inp,.out} for every name in SUITE and
    ggml-vocab-<name>.gguf for every name in EXTRA."""
    root = _home() / "llama.cpp-0.3.36"
    out = root / "models"
    if _complete(out):
        return out
    root.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes: one downloads, the other waits
        if _complete(out):
            return out
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            # MINFER_PIP_ARGS: extra pip options, as for `minfer pull` (e.g. a local mirror)
            extra = shlex.split(os.environ.get("MINFER_PIP_ARGS", ""))
            res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                  "--no-binary", ":all:", "--disable-pip-version-check",
                                  "-d", tmp, *extra, SPEC], capture_output=True, text=True)
            archive = Path(tmp) / ARCHIVE
            if res.returncode != 0 or not archive.is_file():
                tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-3:])
                raise RuntimeError(f"pip download {SPEC} failed (exit {res.returncode}): {tail}")
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()
            if digest != SHA256:
                raise RuntimeError(f"{archive}: sha256 {digest}, expected {SHA256}")
            wanted = {MEMBER_DIR + f"ggml-vocab-{n}.gguf{ext}" for n in SUITE
                      for ext in ("", ".inp", ".out")} | {MEMBER_DIR + f"ggml-vocab-{n}.gguf" for n in EXTRA}
            staged = Path(tmp) / "models"
            staged.mkdir()
            with tarfile.open(archive, "r:gz") as tar:
                for m in tar:
                    if m.name in wanted and m.isfile():
                        src = tar.extractfile(m)
                        (staged / Path(m.name).name).write_bytes(src.read())
            missing = sorted(w for w in wanted if not (staged / Path(w).name).is_file())
            if missing:
                raise RuntimeError(f"{ARCHIVE}: lacks {', '.join(missing)}")
            out.mkdir(exist_ok=True)
            for f in staged.iterdir():
                os.replace(f, out / f.name)
    return out


def read_cases(folder: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of one vocabulary, split as test-tokenizer-0.cpp's read_tests does:
    texts separated by SEP (a text after the last separator only if non-empty), ids one line
    per text. Later duplicates of a text replace earlier ones there (a std::map); here the
    pairs are kept in order, which checks the same ids."""
    raw = (folder / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    lines = (folder / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(texts):
        raise RuntimeError(f"{name}: {len(texts)} texts but {len(lines)} lines of ids")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


if __name__ == "__main__":
    print(suite_dir())
