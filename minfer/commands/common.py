"""Arguments shared by the commands that run a model, and the checks made before loading one.

The flags that mean the same thing as llama.cpp's (`-c/--ctx-size`, `-n/--n-predict`,
`-t/--threads`, `-s/--seed`, `-ngl/--n-gpu-layers`) are defined once here, in parent parsers
that every command running a model is built from (minfer/cli.py passes a command module's
`parents()` to argparse), so that the commands cannot drift apart.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from minfer.device import usable_cpus  # noqa: F401  (commands and tests take it from here)

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
MODEL_HELP = "path to a .gguf file or a catalog name (`minfer list`)"


def add_model_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("-m", "--model", default=None if required else DEFAULT_MODEL, required=required,
                   help=MODEL_HELP + ("" if required else
                                      f"; a catalog model is pulled on first use (default: {DEFAULT_MODEL})"))


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="where to run: cuda (the default when a GPU is present) or cpu; a device "
                   "that cannot run is an error, never a silent fall back to the CPU")


def _engine_parent(ctx: bool) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    g = parent.add_argument_group("model and device (llama.cpp's flags where they mean the same)")
    add_model_arg(g)
    add_device_arg(g)
    if ctx:
        g.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=None, metavar="N",
                       help="context size in tokens: prompt + generated text (default: the model's "
                       "trained length, at most 4096); checked against the memory the KV cache needs")
    g.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch (default: $MINFER_THREADS, else the physical cores: "
                   f"{physical_cores()} here)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="accepted for llama.cpp compatibility. minfer does not split a model: "
                   "all layers go on the device chosen by --device; -ngl 0 without --device means "
                   "--device cpu, any other N changes nothing")
    return parent


# A fresh parent per command, never a shared one: argparse copies a parent's Action objects by
# reference, so one command's set_defaults (chat's -n 512, perplexity's -c 512) would otherwise
# change every other command's default too.


def set_default(p: argparse.ArgumentParser, dest: str, value, help: str) -> None:
    """A command's own default for a parent's flag, and that flag's help saying it: the parent's
    help names the parent's default (chat's -n read "default 256" and used 512)."""
    p.set_defaults(**{dest: value})
    for action in p._actions:
        if action.dest == dest:
            action.help = help


def engine_parent(ctx: bool = True) -> argparse.ArgumentParser:
    """-m, --device, -c/--ctx-size/--ctx (when ctx), -t/--threads, -ngl/--n-gpu-layers."""
    return _engine_parent(ctx)


def generation_parent() -> argparse.ArgumentParser:
    """-n/--n-predict, -s/--seed and the sampling chain (run and chat)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=int, default=256,
                        metavar="N", help="stop after N new tokens; -1 = until the context is full "
                        "(default 256)")
    g = parent.add_argument_group("sampling (llama.cpp's chain and defaults)")
    g.add_argument("--temp", "--temperature", dest="temp", type=float, default=0.8, metavar="T",
                   help="temperature; 0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=40, metavar="K", help="keep the K most likely tokens; 0 = off (default 40)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P",
                   help="keep the most likely tokens up to this total probability; 1 = off (default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, metavar="P",
                   help="drop tokens less likely than P times the top token; 0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="X",
                   help="divide the logits of recently seen tokens by this; 1 = off (default 1.0)")
    g.add_argument("--repeat-last-n", type=int, default=64, metavar="N",
                   help="how many recent tokens the penalties look at; -1 = all (default 64)")
    g.add_argument("--presence-penalty", type=float, default=0.0, metavar="X",
                   help="subtract this from the logit of every recently seen token (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, metavar="X",
                   help="subtract this times the token's recent count from its logit (default 0)")
    g.add_argument("-s", "--seed", type=int, default=None,
                   help="random seed: the same seed gives the same text (default, and -1 as in llama.cpp: "
                   "a fresh one each run)")
    return parent


@functools.lru_cache(maxsize=1)
def physical_cores() -> int:
    """Physical cores this process may run on: distinct (package, core) pairs of the CPUs in its
    affinity mask (Linux sysfs topology); hyper-threads of one core count once. Falls back to
    the number of usable CPUs."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return len(cpus) or 1
    return len(cores) or len(cpus) or 1


def resolve_threads(args) -> int:
    """-t, else $MINFER_THREADS, else the physical cores."""
    from minfer.errors import MinferError

    t = getattr(args, "threads", None)
    if t is None:
        from minfer.switches import Switches

        t = Switches.from_env().threads or physical_cores()   # MinferError names a bad MINFER_THREADS
    if t < 1:
        raise MinferError(f"-t/--threads {t}: expected at least 1 thread")
    return t




@functools.lru_cache(maxsize=None)
def _capped_threads(t: int, cpus: int) -> int:
    """The thread count used for -t t on `cpus` CPUs, warning once per process when it is cut."""
    if t <= cpus:
        return t
    # measured on 2 CPUs, smollm2-135m: `minfer run` took 4.2 s at -t 2 and 8, 9.9 s at -t 32 and
    # 32 s at -t 128, almost all of it before the first token (not profiled further); -t 1000 ran
    # past a 120 s limit
    warn(f"-t/--threads {t}: this process may run on {cpus} CPUs, and more threads than CPUs "
         f"only slow every step; using {cpus}")
    return cpus


def apply_threads(args) -> int:
    import torch

    t = _capped_threads(resolve_threads(args), usable_cpus())
    if torch.get_num_threads() != t:
        torch.set_num_threads(t)
    return t


def device_from_args(args) -> str | None:
    """--device, with llama.cpp's -ngl 0 (no layer on the GPU) meaning the CPU when --device is absent."""
    if args.device is None and getattr(args, "n_gpu_layers", None) == 0:
        return "cpu"
    return args.device


def resolve_device(name: str | None) -> str:
    """The device to run on (minfer.device's rule: the one asked for, else cuda when a GPU is
    present, else cpu; a chosen device that cannot run is an error, never a silent fall back)."""
    try:
        from minfer.device import resolve_device as rule
    except ImportError:   # before minfer/device.py exists (it is being added beside this change)
        import torch

        from minfer.errors import MinferError

        if name == "cuda" and not torch.cuda.is_available():
            raise MinferError("--device cuda was asked for, but torch sees no CUDA GPU on this "
                              f"machine (torch {torch.__version__}); use --device cpu") from None
        return name or ("cuda" if torch.cuda.is_available() else "cpu")
    return rule(name)


def warn(msg: str) -> None:
    print(f"minfer: warning: {msg}", file=sys.stderr)


def missing_folders(out) -> tuple:
    """(the nearest ancestor folder of the path `out` that exists, the missing folders between, deepest
    first): what a write that makes its folders would make (synth's OUT.gguf, bench's --out)."""
    found, missing = out.absolute().parent, []
    while not found.exists() and found != found.parent:
        missing.append(found)
        found = found.parent
    return found, missing
