"""Shared by the first-hour tests (tests/test_firsthour_*.py): running `minfer ARGV` for its one
error line, and the synthetic tiny model they run on."""

from __future__ import annotations


def one_error_line(capsys, argv, rc=1) -> str:
    """The last stderr line of `minfer ARGV`, which must exit with status rc (2: argparse's usage
    error, raised as SystemExit) and print no traceback."""
    from minfer import cli

    try:
        got = cli.main(argv)
    except SystemExit as e:
        got = e.code
    err = capsys.readouterr().err
    assert got == rc, (got, err)
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def write_tiny_model(directory) -> str:
    """The synthetic tiny model (4 layers, a byte-level vocab, a ChatML template) written into
    `directory`; its path."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth

    return str(write_synth(directory / "tiny.gguf", get_preset("tiny"), "q8_0", progress=False).path)


def kv_block_bytes(path: str) -> int:
    """Bytes of one 16-position KV block of the model at `path` on the CPU: keys and values,
    float32 (computed from its header, not by the code under test)."""
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile

    cfg = ModelConfig.from_gguf(GGUFFile(path))
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 * 16
