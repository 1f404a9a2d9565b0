"""The Gluon q8 GEMV's IS_SPLIT constexpr by Switches.split_gather (gemv_q8g_loads.split_const): which builds sum a
split tile's partials in one gathered load and which keep the loop (perf-log BA3, BB1)."""
from dataclasses import replace

import pytest

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_q8g_loads import split_const
from minfer.switches import Switches


def test_no_split_is_false_whatever_the_switch():
    for gather in (0, 1, 2):
        assert split_const(1, gather, 0) is False
        assert split_const(1, gather, 72) is False


def test_gather_1_every_split_build_gets_the_power_of_two():
    assert split_const(8, 1, 72) == 8          # the 7B's Q4_K down (capped)
    assert split_const(5, 1, 0) == 8           # the 7B's Q6_K down: 5 splits, 8 rows of the gather
    assert split_const(2, 1, 0) == 2


def test_gather_2_only_uncapped_builds():
    assert split_const(8, 2, 72) is True       # capped: the loop (the gather build spilled at 72 registers)
    assert split_const(5, 2, 0) == 8           # uncapped: the gather


def test_gather_0_keeps_the_loop():
    assert split_const(8, 0, 0) is True
    assert split_const(5, 0, 72) is True


def test_switch_parses_the_three_modes():
    assert Switches.from_env({}).split_gather == 1
    for v in (0, 1, 2):
        assert Switches.from_env({"MINFER_SPLIT_GATHER": str(v)}).split_gather == v


def test_an_unknown_mode_is_an_error_naming_the_switch():
    # from the environment and from direct construction alike (Switches.__post_init__), one message
    for make in (lambda: Switches.from_env({"MINFER_SPLIT_GATHER": "3"}), lambda: Switches(split_gather=3),
                 lambda: replace(Switches(), split_gather=7)):
        with pytest.raises(MinferError, match=r"MINFER_SPLIT_GATHER='\d': expected 0, 1 or 2"):
            make()


def test_the_switch_refuses_an_unknown_mode_when_read():
    with pytest.raises(MinferError, match="MINFER_SPLIT_GATHER='3': expected 0, 1 or 2"):
        Switches.from_env({"MINFER_SPLIT_GATHER": "3"})


def test_direct_construction_takes_the_modes_and_bools():
    # tests/gpu/test_split_gather_gpu.py builds Switches(split_gather=False / True): 0 and 1 (an H200 run of
    # 9bfccc5's first form, which checked str(value), failed there)
    assert Switches(split_gather=True).split_gather == 1 and Switches(split_gather=False).split_gather == 0
    assert Switches(split_gather=2).split_gather == 2
