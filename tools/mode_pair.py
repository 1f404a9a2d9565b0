"""Two switch sets in a tiny model's graphed greedy decode (tests/gpu/graphed_pair.compare_decodes),
each step's logits relative error printed whether or not the pair passes the tests' rule: where
two norm modes part, and by how much (perf-log AL4).
    python tools/mode_pair.py SEED PROMPT_SEED "A: k=v,..." "B: k=v,..." ["A ..." "B ..."]..."""
import os
import sys
import tempfile
from pathlib import Path

from _pytest.monkeypatch import MonkeyPatch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
from graphed_pair import compare_decodes  # noqa: E402

from minfer.switches import Switches  # noqa: E402


def switches(text: str) -> Switches:
    kw = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=")
        kw[k] = int(v) if v.lstrip("-").isdigit() else v
    return Switches(**kw)


def main():
    seed, pseed = int(sys.argv[1]), int(sys.argv[2])
    pairs = sys.argv[3:]
    for a, b in zip(pairs[::2], pairs[1::2]):
        errs, mp = [], MonkeyPatch()
        try:
            with tempfile.TemporaryDirectory() as d:
                compare_decodes(Path(d), mp, switches(a), switches(b), seed=seed, prompt_seed=pseed, n_prompt=10,
                                same_prefill=True, errs=errs)
            verdict = "passes"
        except AssertionError as e:
            verdict = f"fails ({str(e).splitlines()[0][:100]})"
        finally:
            mp.undo()
        print(f"[{a}] vs [{b}], seed {seed}: {verdict}; max {max(errs):.2e}, steps at 0: "
              f"{sum(e == 0 for e in errs)} of {len(errs)}; " + " ".join(f"{e:.1e}" for e in errs), flush=True)


if __name__ == "__main__":
    main()
