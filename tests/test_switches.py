"""Switches: parsing from the environment, copies for A/B, the README table generated from the
field docs, and the retired names."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minfer.errors import MinferError
from minfer.process_env import RETIRED, retired_in_env
from minfer.switches import Switches, markdown_table


def test_defaults_and_from_env():
    assert Switches.from_env({}) == Switches()
    sw = Switches.from_env({"MINFER_GEMV": "0", "MINFER_GEMV_MAX_M": "16", "MINFER_PREFETCH": "off",
                            "MINFER_ACT_DTYPE": "float32", "MINFER_CUDA_GRAPH": "", "OTHER": "x"})
    assert (sw.gemv, sw.gemv_max_m, sw.prefetch, sw.act_dtype, sw.cuda_graph) == (False, 16, False, "float32", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sw.gemv = True


@pytest.mark.parametrize("env,msg", [({"MINFER_GEMV": "maybe"}, "MINFER_GEMV='maybe': expected 0 or 1"),
                                     ({"MINFER_GEMV_MAX_M": "x"}, "expected an integer"),
                                     ({"MINFER_PREFILL_GRAPHS": "-1"}, "non-negative"),
                                     ({"MINFER_ACT_DTYPE": "int8"}, "expected one of"),
                                     ({"MINFER_PDL_EARLY_SITES": "rope_kv,rope"},
                                      "MINFER_PDL_EARLY_SITES='rope_kv,rope': unknown site 'rope' (sites: rope_kv")])
def test_bad_values_name_the_variable(env, msg):
    with pytest.raises(MinferError, match=re.escape(msg)):
        Switches.from_env(env)


def test_with_env_is_a_copy():
    base = Switches(prefill_chunk=7)
    sw = base.with_env({"MINFER_GEMV": "0", "MINFER_PREFILL_CHUNK": None})
    assert sw.gemv is False and sw.prefill_chunk == 0 and base.gemv is True and base.prefill_chunk == 7
    with pytest.raises(MinferError, match="MINFER_NOPE is not a minfer switch"):
        base.with_env({"MINFER_NOPE": "1"})
    assert base.off() == {} and sw.off() == {"gemv": "MINFER_GEMV"}


def test_every_field_is_documented():
    envs = [f.metadata["env"] for f in dataclasses.fields(Switches)]
    assert len(set(envs)) == len(envs) and all(e.startswith("MINFER_") for e in envs)
    for f in dataclasses.fields(Switches):
        assert f.metadata["doc"] and f.metadata["kind"] in ("switch", "tuning")
        if f.metadata["kind"] == "switch":
            assert f.default is True, f.name              # fast paths are on by default
    assert not set(RETIRED) & set(envs)
    assert retired_in_env({"MINFER_GROUP_FFN": "1"})[0].startswith("MINFER_GROUP_FFN (retired:")


def test_readme_table_is_the_generated_one():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    m = re.search(r"<!-- switch-table:begin -->\n(.*?)\n<!-- switch-table:end -->", readme, re.S)
    assert m, "README.md has no switch table markers"
    assert m.group(1) == markdown_table()
    out = subprocess.run([sys.executable, "-m", "minfer.switches"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == markdown_table()
    for f in dataclasses.fields(Switches):
        assert f"`{f.metadata['env']}`" in m.group(1)


def test_debug_paths_prints_the_report_at_exit():
    import os

    code = ("from minfer.ops import paths; paths.count('qmatmul.Q4_K.decode'); "
            "paths.switched_off('qmatmul.Q4_K.prefill', 'MINFER_FUSE_GROUPS')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINFER_")}
    on = subprocess.run([sys.executable, "-c", code], env={**env, "MINFER_DEBUG_PATHS": "1"},
                        capture_output=True, text=True, check=True)
    assert "minfer launch paths (MINFER_DEBUG_PATHS=1):\n  qmatmul.Q4_K.decode: 1" in on.stderr
    assert "(switched off by MINFER_FUSE_GROUPS=0): 1" in on.stderr
    assert "MINFER_FUSE_GROUPS (fuse_groups: prefill: a declared weight group" in on.stderr
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "launch paths" not in off.stderr


def test_debug_paths_tells_default_off_from_switched_off():
    """A tuning switch that is off by default and not set gates its path "off by default" (the
    report does not claim the user switched it off); set to 0 in the environment, it did."""
    import os

    code = ("from minfer.ops import paths; "
            "paths.switched_off('attention.decode.rope', 'MINFER_DECODE_ATTN_ROPE')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINFER_")}
    env["MINFER_DEBUG_PATHS"] = "1"
    unset = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "attention.decode.rope (off by default: MINFER_DECODE_ATTN_ROPE=1 turns it on): 1" in unset.stderr
    assert "switches that turned paths off" not in unset.stderr
    zero = subprocess.run([sys.executable, "-c", code], env={**env, "MINFER_DECODE_ATTN_ROPE": "0"},
                          capture_output=True, text=True, check=True)
    assert "attention.decode.rope (switched off by MINFER_DECODE_ATTN_ROPE=0): 1" in zero.stderr
    assert "switches that turned paths off:\n  MINFER_DECODE_ATTN_ROPE (decode_attn_rope:" in zero.stderr
