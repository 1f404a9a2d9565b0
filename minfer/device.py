"""Which device to run on, and the CUDA backend: one rule for the library, the CLI and the server.

The rule (stated in `minfer run --help` and in `minfer.load`'s docstring): with no device asked
for, minfer runs on CUDA when torch sees a GPU, else on the CPU. A device that was chosen (asked
for, or CUDA because a GPU is present) is used or the run fails with a MinferError that says
why; minfer never falls back to the CPU silently.

This module imports nothing else from minfer but the errors, so ops/, weights.py, api.py and the
commands all import it without a cycle.
"""

from __future__ import annotations

from minfer.errors import MinferError

RULE = ("device: cuda when torch sees a GPU, else cpu; a chosen device that cannot run is an "
        "error, never a silent fall back to the CPU")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; hyper-threads count)."""
    import os

    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory(device: str) -> int | None:
    """Memory a new allocation can take: free GPU memory on cuda, MemAvailable on the CPU (None:
    no figure). commands/preflight.py's checks (available_bytes) and the CPU load's weights
    check (runtime/cpu_memory.py) read it."""
    import os

    if device == "cuda":
        import torch

        try:
            return int(torch.cuda.mem_get_info()[0])
        except Exception:  # noqa: BLE001 -- no figure is better than a crash here
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def resolve_device(name: str | None) -> str:
    """'cuda' or 'cpu': the one asked for, else cuda when present, else cpu. Asking for cuda
    without a GPU, or choosing cuda while its backend cannot load, is a MinferError."""
    import torch

    if name not in (None, "cuda", "cpu"):
        raise MinferError(f"--device {name!r}: expected cuda or cpu")
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "cuda" and not torch.cuda.is_available():
        raise MinferError("--device cuda was asked for, but torch sees no CUDA GPU on this machine "
                          f"(torch {torch.__version__}); use --device cpu")
    if name == "cuda":
        cuda_backend()      # fail here, before any weight is read
    return name


def cuda_backend():
    """minfer.ops.cuda (Triton kernels), imported on first use; a MinferError naming the
    import failure when it cannot load (e.g. no Triton)."""
    try:
        import minfer.ops.cuda as cuda_ops
    except ImportError as e:
        raise MinferError(f"the CUDA backend cannot load ({e}); use --device cpu") from e
    return cuda_ops
