"""The machine block of a bench record: nvidia-smi parsing (with a stand-in nvidia-smi that
refuses one field, as old drivers do), git commit, versions."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from minfer.bench import machine


def _fake_smi(tmp_path, monkeypatch, script: str):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smi_two_gpus(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, 'printf "NVIDIA H200, 1980, 1980, 3201, 3201, 700.00, 570.1, 41\\n'
                                     'NVIDIA H200, 345, 1980, 3201, 3201, 700.00, 570.1, 30\\n"\n')
    gpus = machine.nvidia_smi()
    assert len(gpus) == 2
    assert gpus[0]["name"] == "NVIDIA H200" and gpus[0]["clocks.sm"] == "1980"
    assert gpus[1]["clocks.sm"] == "345" and gpus[1]["power.limit"] == "700.00"


def test_nvidia_smi_unknown_field_asked_alone(tmp_path, monkeypatch):
    # refuses any query naming clocks.max.mem; answers a one-field query with a fixed value
    _fake_smi(tmp_path, monkeypatch, 'case "$1" in *clocks.max.mem*) echo "invalid field" >&2; exit 2;; esac\n'
                                     'echo "v-${1#--query-gpu=}"\n')
    gpus = machine.nvidia_smi()
    assert len(gpus) == 1
    assert "clocks.max.mem" not in gpus[0]
    assert gpus[0]["name"] == "v-name" and gpus[0]["clocks.sm"] == "v-clocks.sm"


def test_git_commit_matches_checkout(monkeypatch):
    monkeypatch.delenv("MINFER_COMMIT", raising=False)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(machine.__file__))))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    info = machine.git_commit()
    if head.returncode == 0:
        assert info["commit"] == head.stdout.strip() and isinstance(info["dirty"], bool)
    else:
        assert info == {"commit": None, "dirty": None}


def test_git_commit_env_wins(monkeypatch):
    """The device copy's .git may be stale: the commit the caller names is the one recorded."""
    monkeypatch.setenv("MINFER_COMMIT", "539d4e3")
    assert machine.git_commit() == {"commit": "539d4e3", "dirty": None, "source": "MINFER_COMMIT"}


def test_machine_info_cpu(monkeypatch):
    import torch

    monkeypatch.setenv("MINFER_SOME_SWITCH", "0")
    info = machine.machine_info("cpu")
    assert info["gpu"] is None
    assert info["torch"] == torch.__version__ and info["python"] == sys.version.split()[0]
    assert info["env"]["MINFER_SOME_SWITCH"] == "0"
    assert "CPU" in machine.short_machine(info)
