"""One graphed greedy decode pair of tests/gpu/graphed_pair.py, run for its report rather than as a
test: where the two engines' greedy tokens part, the step, the logits' relative error and both
engines' top-2 margins (a near-tie flips; a wrong kernel is off by ~1). GPU only.
    python tools/pair_margin.py "norm_into_gemv=5" "gemv_q8_gluon=False,norm_into_gemv=5" [seed prompt_seed n_prompt]"""
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from graphed_pair import compare_decodes  # noqa: E402

from minfer.switches import Switches  # noqa: E402


def switches(text: str) -> Switches:
    kw = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=")
        kw[k] = v == "True" if v in ("True", "False") else int(v)
    return Switches(**kw)


def main():
    a, b = switches(sys.argv[1]), switches(sys.argv[2])
    seed, prompt_seed, n_prompt = (int(v) for v in (sys.argv[3:6] or (8, 5, 9)))
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        try:
            compare_decodes(Path(d), mp, a, b, seed=seed, prompt_seed=prompt_seed, n_prompt=n_prompt)
            print(f"{sys.argv[1]} vs {sys.argv[2]}: the same 24 greedy tokens")
        except AssertionError as e:
            print(f"{sys.argv[1]} vs {sys.argv[2]}: {e}")


if __name__ == "__main__":
    main()
