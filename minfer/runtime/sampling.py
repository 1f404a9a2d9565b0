"""Choosing the next token: pure functions on a logits vector (V,).

The chain and its semantics follow llama.cpp (src/llama-sampling.cpp; default order in
common/sampling.cpp): penalties -> top-k -> top-p -> min-p -> temperature -> draw.
- penalties (llama_sampler_penalties_apply): over the last `penalty_last_n` tokens, a token
  seen c > 0 times gets logit /= repeat (if logit > 0) or logit *= repeat (if <= 0), then
  logit -= c * frequency + presence.
- top-k: keep the k largest logits (k <= 0: off).
- top-p (llama_sampler_top_p_apply): softmax of the current logits, sorted; keep the
  shortest prefix whose cumulative probability reaches p (the crossing token included).
- min-p (llama_sampler_min_p_apply): keep tokens with p_i >= min_p * p_max, i.e.
  logit_i >= max_logit + log(min_p).
- temperature: logits / T; T <= 0 means greedy (the argmax only), and so does a T under
  minfer.limits.GREEDY_BELOW (1e-5, vLLM's rule: SamplingParams stores it as 0).
Filtering before temperature means top-p/min-p see the untempered distribution, as in llama.cpp.
A removed token gets logit -inf. At least one token always survives.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch

from minfer.errors import MinferError
from minfer.limits import effective_temperature

# seeds are 64-bit: torch.Generator.manual_seed takes -2**63 .. 2**64 - 1
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
# the command-line flag of each field, so one message serves `minfer run` and the server
_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
          "repeat_penalty": "--repeat-penalty", "presence_penalty": "--presence-penalty",
          "frequency_penalty": "--frequency-penalty", "seed": "--seed", "penalty_last_n": "--repeat-last-n"}


class NonFiniteLogitsError(MinferError):
    """The model produced NaN or +inf logits: its weights or metadata are broken."""

# under this a penalty divides a logit into float32's overflow (NaN probabilities after the load);
# the server's schema has the same bound (server/schemas.py repetition_penalty)
REPEAT_PENALTY_MIN = 1e-6


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    penalty_last_n: int = 64      # how many recent tokens the penalties look at (-1: all)

    def __post_init__(self) -> None:
        """Refuse values that would make NaN probabilities or crash the draw (issue 15: a
        temperature of nan or inf, a repeat penalty of 0 or nan ended in a traceback)."""
        def bad(field: str, expected: str) -> MinferError:
            value = getattr(self, field)
            shown = f"{value!r}" if not isinstance(value, int) or abs(value) < 1 << 70 else f"a {value.bit_length()}-bit integer"
            return MinferError(f"sampling parameter {field} ({_FLAGS[field]}) = {shown[:40]}: expected {expected}")

        def number(field: str) -> float:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(field, "a finite number")
            return v

        if number("temperature") < 0:
            raise bad("temperature", "a number >= 0 (0 = greedy)")
        # greedy in all but exact ties; 1e-38 and under divided the logits into inf (NaN
        # probabilities after the load): the one rule for the library, the server and the CLI
        self.temperature = effective_temperature(self.temperature)
        if not 0 <= number("top_p") <= 1:
            raise bad("top_p", "a number in 0..1 (1 = off)")
        if not 0 <= number("min_p") <= 1:
            raise bad("min_p", "a number in 0..1 (0 = off)")
        if number("repeat_penalty") < REPEAT_PENALTY_MIN:
            raise bad("repeat_penalty", f"a number >= {REPEAT_PENALTY_MIN:g} (1 = off)")
        number("presence_penalty")
        number("frequency_penalty")
        for field in ("top_k", "penalty_last_n"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise bad(field, "an integer >= -1 (0 and -1 = off)" if field == "top_k"
                          else "an integer >= -1 (-1 = all tokens)")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not SEED_MIN <= seed <= SEED_MAX):
            raise bad("seed", f"an integer in {SEED_MIN}..{SEED_MAX} (64 bits)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def apply_penalties(logits: torch.Tensor, history: Sequence[int], repeat: float = 1.0,
                    presence: float = 0.0, frequency: float = 0.0) -> torch.Tensor:
    """(V,) -> (V,): llama.cpp's repetition/presence/frequency penalties over `history`."""
    if not history or (repeat == 1.0 and presence == 0.0 and frequency == 0.0):
        return logits
    counts = Counter(int(t) for t in history)
    ids = torch.tensor(list(counts.keys()), dtype=torch.long)
    c = torch.tensor(list(counts.values()), dtype=logits.dtype)
    out = logits.clone()
    x = out[ids]
    x = torch.where(x <= 0, x * repeat, x / repeat)
    x = x - c * frequency - presence
    out[ids] = x
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits
    probs = torch.softmax(logits.double(), -1)
    sorted_p, order = torch.sort(probs, descending=True)
    cum = torch.cumsum(sorted_p, -1)
    # number kept = 1 + how many prefixes stay below p (the token that reaches p is kept)
    n_keep = int((cum < p).sum().item()) + 1
    n_keep = min(n_keep, logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[order[:n_keep]] = True
    return logits.masked_fill(~keep, -math.inf)


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p <= 0.0:
        return logits
    threshold = logits.max() + math.log(p)
    return logits.masked_fill(logits < threshold, -math.inf)


def filtered_logits(logits: torch.Tensor, params: SamplingParams, history: Sequence[int] = ()) -> torch.Tensor:
    """The logits after penalties, top-k, top-p, min-p and temperature (float32 (V,))."""
    x = logits.float()
    last_n = params.penalty_last_n
    recent = list(history) if last_n < 0 else list(history)[-last_n:] if last_n > 0 else []
    x = apply_penalties(x, recent, params.repeat_penalty, params.presence_penalty, params.frequency_penalty)
    if params.greedy:
        best = int(torch.argmax(x))
        return torch.full_like(x, -math.inf).index_fill_(0, torch.tensor([best]), 0.0)
    x = top_k_filter(x, params.top_k)
    x = top_p_filter(x, params.top_p)
    x = min_p_filter(x, params.min_p)
    return x / params.temperature


def probabilities(logits: torch.Tensor, params: SamplingParams, history: Sequence[int] = ()) -> torch.Tensor:
    """The distribution the next token is drawn from, (V,) float64."""
    return torch.softmax(filtered_logits(logits, params, history).double(), -1)


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator: the same seed gives the same draws; None draws a seed from the OS."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1 if seed is None else int(seed))
    return g


def check_finite(logits: torch.Tensor) -> None:
    """Raise NonFiniteLogitsError when logits hold NaN or +inf (-inf is a masked token)."""
    if bool(torch.isnan(logits).any()) or bool(torch.isposinf(logits).any()):
        bad = "NaN" if bool(torch.isnan(logits).any()) else "infinite"
        raise NonFiniteLogitsError(
            f"the model produced {bad} logits, so no token can be sampled; the model file is "
            "probably broken: a metadata value (attention.layer_norm_rms_epsilon, rope.freq_base) "
            "the model cannot work with, or a tensor whose type does not match its data")


def check_model_logits(engine) -> None:
    """Refuse, at load, a model whose logits for a first pair of tokens are NaN or infinite (a
    tensor whose type does not match its bytes loads "fine" and then fails every request); an
    encoder's (Model.causal False) hidden rows instead.
    Two tokens: the plain prefill path on every device, no graph capture. Costs one forward
    of two tokens; the engine's cache is left empty."""
    bos = getattr(engine.tokenizer, "bos_id", None)
    first = bos if bos is not None else 0
    if not getattr(engine.model, "causal", True):
        # an encoder (bert) has no logits: its hidden rows instead, which Engine.embed checks are finite
        try:
            engine.embed([first, first], pooling="none", normalize=-1)
        except MinferError as e:
            raise MinferError(f"{engine.path}: refused at load: {e}") from None
        finally:
            engine.reset()
        return
    try:
        logits = engine.forward([first, first], 0)
    finally:
        engine.reset()
    try:
        check_finite(logits)
    except NonFiniteLogitsError as e:
        raise NonFiniteLogitsError(f"{engine.path}: refused at load: {e}") from None


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           history: Sequence[int] = ()) -> int:
    """The next token id from logits (V,); NonFiniteLogitsError on NaN/+inf logits."""
    logits = logits.cpu()
    if not bool(torch.isfinite(logits).all()):  # one cheap pass; the details only on failure
        check_finite(logits)
        if bool(torch.isneginf(logits).all()):
            raise MinferError("every token has logit -inf: no token can be sampled")
    x = filtered_logits(logits, params, history)
    if params.greedy:
        return int(torch.argmax(x))
    probs = torch.softmax(x.double(), -1)
    if not bool(torch.isfinite(probs).all()):
        raise MinferError("the sampling parameters turned the logits into NaN probabilities "
                          f"(temperature {params.temperature:g}, repeat penalty {params.repeat_penalty:g}); "
                          "use values closer to the defaults")
    return int(torch.multinomial(probs, 1, generator=generator).item())


def logprobs(logits: torch.Tensor, token: int, top_n: int = 0):
    """The model's log-probability of `token` (before any sampling filter), and the `top_n`
    most likely tokens as [(id, logprob), ...]."""
    lp = torch.log_softmax(logits.float().cpu(), -1)
    top = []
    if top_n > 0:
        v, i = torch.topk(lp, min(top_n, lp.shape[-1]))
        top = [(int(a), float(b)) for a, b in zip(i.tolist(), v.tolist())]
    return float(lp[token]), top
