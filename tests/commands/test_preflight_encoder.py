"""preflight.check_ctx on an encoder: no KV cache is allocated for it (runtime/embed.py NoCache), so a context
whose cache would not fit in the memory left is not refused for one, while a decoder's still is."""

from __future__ import annotations

from pathlib import Path

import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.mark.parametrize("name,refused", [("bert-rank", False), ("bert", False), ("llama3", True)])
def test_an_encoder_needs_no_kv_memory(monkeypatch, name, refused):
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(str(DATA / f"{name}.gguf"))
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 1)      # 1 byte left
    warned = []
    if refused:
        with pytest.raises(MinferError, match="the KV cache would need"):
            preflight.check_ctx(gf, 64, "cpu", warned.append)
    else:
        assert preflight.check_ctx(gf, 64, "cpu", warned.append) == 64 and not warned
