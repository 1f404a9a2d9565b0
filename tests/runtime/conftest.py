"""Fixtures shared by the batch-engine tests of this folder."""

from __future__ import annotations

import pytest
import torch

from minfer.gguf_file import GGUFFile
from minfer.models import load_model
from models.tiny import TinySpec, write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random qwen2 model (vocab 64, context 256) for the batch engine's tests. One torch
    thread while a module uses it: these ops are tiny, and a second thread on a shared 2-core
    machine only waits."""
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "t.gguf",
                            TinySpec(arch="qwen2", seed=5, ctx=256, vocab=64))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(GGUFFile(path), progress=False)
    torch.set_num_threads(n)
