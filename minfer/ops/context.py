"""What the engine passes to the ops besides tensors: its switches and its workspace.

    ctx = Context(Switches.from_env(), cuda_backend().Workspace.for_model(model))   # Engine.load
    ops.linear(x, w, bias, ctx)

The CPU reference ignores it. The CUDA ops read their fast-path switches from `ctx.switches`
and take scratch buffers, the prefetch runner and converted biases from `ctx.workspace`
(minfer.ops.cuda.workspace.Workspace). `ctx=None` (tests, one-off calls) means the default
switches and a workspace made for that call alone. A CUDA-graph capture passes a copy with
some switches changed (`ctx.with_switches(prefetch=False)`); nothing here is process-wide.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from minfer.switches import Switches


@dataclass(frozen=True)
class Context:
    switches: Switches = field(default_factory=Switches)
    workspace: Any = None        # minfer.ops.cuda.workspace.Workspace on CUDA; None on the CPU

    def with_switches(self, **changes) -> "Context":
        """A copy whose switches have `changes` (field=value) applied; same workspace."""
        return replace(self, switches=replace(self.switches, **changes))


DEFAULT = Context()
