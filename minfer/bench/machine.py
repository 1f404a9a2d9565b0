"""What a recorded benchmark ran on: GPU, clocks, library versions, minfer commit, date.

Numbers from different machines, clocks or commits are not comparable; every JSON record
carries this block so that a reader can tell.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_commit() -> dict:
    """The minfer checkout's commit and whether it had uncommitted changes (None outside git).

    MINFER_COMMIT, when set, wins: the device scripts are given it by the caller
    (`MINFER_COMMIT=$(git rev-parse HEAD)`), because the GPU machine's copy of the tree has no
    .git or, as seen on 2026-11-29, a stale one (it reported 32f0baa + dirty for 539d4e3)."""
    from minfer.process_env import process_setting

    env = process_setting("MINFER_COMMIT") or None
    if env:
        return {"commit": env, "dirty": None, "source": "MINFER_COMMIT"}
    repo = str(Path(__file__).resolve().parents[2])
    head = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if head is None:
        return {"commit": None, "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": head, "dirty": bool(status)}


def nvidia_smi() -> list[dict]:
    """Per GPU: name, clocks (current and max SM/memory, MHz), power limit, driver. A field
    this driver does not know fails the whole query, so on failure each is asked alone."""
    if not shutil.which("nvidia-smi"):
        return []
    fields = ["name", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
              "power.limit", "driver_version", "temperature.gpu"]

    def query(names: list[str]) -> list[list[str]] | None:
        out = _run(["nvidia-smi", f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits"])
        return None if out is None else [[v.strip() for v in line.split(",")] for line in out.splitlines()]

    rows = query(fields)
    if rows is not None:
        return [dict(zip(fields, r)) for r in rows]
    gpus: list[dict] = []
    for f in fields:
        col = query([f])
        for i, r in enumerate(col or []):
            while len(gpus) <= i:
                gpus.append({})
            gpus[i][f] = r[0]
    return gpus


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str) -> dict:
    import numpy
    import torch

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from minfer import __version__

    info["minfer"] = __version__
    info.update(git_commit())
    # the MINFER_* variables set (switches and process settings), for the record
    from minfer.process_env import environ_snapshot

    info["env"] = environ_snapshot()
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["gpu"] = {
            "name": props.name,
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "nvidia_smi": nvidia_smi(),
        }
    else:
        info["gpu"] = None
    return info


def short_machine(info: dict) -> str:
    """One line for table headers: 'NVIDIA H200 (132 SMs), torch 2.11, commit abc1234'."""
    gpu = info.get("gpu")
    where = f"{gpu['name']} ({gpu['sm_count']} SMs)" if gpu else f"CPU {info.get('cpu')} ({info.get('torch_threads')} threads)"
    commit = (info.get("commit") or "unknown")[:10] + ("+dirty" if info.get("dirty") else "")
    return f"{where}, torch {info.get('torch')}, triton {info.get('triton')}, commit {commit}, {info.get('date')}"
