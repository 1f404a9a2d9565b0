"""ops/cuda/pdl.enabled: which launch sites signal the next kernel before their wait (mode 2):
all the early_ok sites with Switches.pdl_early, only the named ones with pdl_early_sites, and
never a site that is not early_ok. The device check is stubbed (no GPU here): a CUDA device of
compute capability 9.0."""

from __future__ import annotations

import pytest

from minfer.ops.cuda import pdl
from minfer.switches import Switches


@pytest.fixture
def sm90(monkeypatch):
    import minfer.ops.cuda.dequant as dq

    monkeypatch.setattr(dq, "interpret", lambda: False)
    monkeypatch.setitem(pdl._capability, 0, (9, 0))
    return "cuda:0"


@pytest.mark.parametrize("sw,site,early_ok,mode", [
    (Switches(), "rope_kv", True, 1),
    (Switches(pdl_early=True), "rope_kv", True, 2),
    (Switches(pdl_early=True), "gemv", False, 1),
    (Switches(pdl_early_sites="rope_kv"), "rope_kv", True, 2),
    (Switches(pdl_early_sites="rope_kv"), "add_rms_norm", True, 1),
    (Switches(pdl_early_sites="swiglu,rope_kv"), "swiglu", True, 2),
    (Switches(pdl_early_sites="rope_kv"), "rope_kv", False, 1),
    (Switches(pdl=False, pdl_early_sites="rope_kv"), "rope_kv", True, 0),
])
def test_early_sites(sm90, sw, site, early_ok, mode):
    assert pdl.enabled(sw, sm90, site, early_ok=early_ok) == mode
