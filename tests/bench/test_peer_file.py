"""The torch peer (`minfer bench --peer torch-bf16`) refuses, before anything loads, a file holding a tensor its
dense llama / qwen2 forward does not compute: Mixtral's experts made it dequantize every expert to bf16 and then
fail with a KeyError in its first forward, after the minfer side had been measured; InternLM3's o / MLP biases
were silently left out of its model."""
from pathlib import Path

import pytest

from minfer.bench.peers import TorchPeer, check_peer_file
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.mark.parametrize("name, tensor", [("mixtral", "_exps.weight"), ("internlm3-bias", ".bias")])
def test_a_tensor_the_peer_does_not_run_is_named(name, tensor):
    gf = GGUFFile(DATA / f"{name}.gguf")
    with pytest.raises(MinferError) as e:
        check_peer_file(gf)
    msg = str(e.value)
    assert f"{name}.gguf" in msg and "tensor 'blk." in msg and tensor in msg and "--peer torch-bf16" in msg
    assert "attn_q.bias" not in msg.split("tensor ")[1].split("'")[1]     # q/k/v biases are the peer's own
    with pytest.raises(MinferError, match="is not part of the torch peer"):
        TorchPeer(gf, device="cpu", n_ctx=8)


@pytest.mark.parametrize("name", ["llama3", "internlm3"])
def test_a_dense_file_is_the_peer_s(name):
    check_peer_file(GGUFFile(DATA / f"{name}.gguf"))


def test_another_architecture_is_named():
    with pytest.raises(MinferError, match="the torch peer runs llama, qwen2, not 'qwen2moe'"):
        check_peer_file(GGUFFile(DATA / "qwen2moe.gguf"))


def test_bench_checks_the_file_before_the_engine_loads(monkeypatch):
    """bench's run refuses the peer's file before Engine.load (nothing measured and thrown away); the CUDA-only
    check is stubbed so the file check is reached on this CPU machine."""
    import minfer.bench.peers as P
    from minfer.bench import bench as B
    from minfer.runtime.engine import Engine

    monkeypatch.setattr(P, "check_peer", lambda name, device: None)

    def no_load(*a, **k):
        raise AssertionError("the engine was loaded before the peer's file was checked")
    monkeypatch.setattr(Engine, "load", no_load)
    with pytest.raises(MinferError, match="_exps.weight"):
        B.run_bench(str(DATA / "mixtral.gguf"), device="cpu", n_prompt=[4], n_gen=[0], depths=[0], reps=1,
                    peer="torch-bf16", progress=False)
