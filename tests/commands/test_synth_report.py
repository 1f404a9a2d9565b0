"""`minfer synth`'s closing line gives the tensor data in a unit that shows it: the tiny preset's
1.8 MiB read "0.00 GiB of tensor data"."""

from __future__ import annotations

import re

from minfer import cli


def test_synth_reports_small_tensor_data_in_mib(capsys, tmp_path):
    import gguf

    out = tmp_path / "tiny.gguf"
    assert cli.main(["synth", str(out), "--preset", "tiny", "--recipe", "q8_0", "--no-progress"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.search(r"([0-9.]+) MiB of tensor data", line)
    assert m, line
    # the gguf package (llama.cpp's reader) as the reference for the bytes written
    total = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(out)).tensors)
    assert abs(float(m.group(1)) - total / 2**20) < 0.01, (line, total)
