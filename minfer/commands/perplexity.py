"""`minfer perplexity`: how well a model predicts a text, by llama-perplexity's protocol."""

from __future__ import annotations

import argparse
import math
import sys

HELP = "measure a model's perplexity on a text file (llama.cpp's llama-perplexity protocol)"
DESCRIPTION = """Perplexity = exp(mean negative log-likelihood of each token given the ones before).
Lower is better; comparable between runs only for the same text, model tokenizer and -c.

The protocol is llama.cpp's (tools/perplexity/perplexity.cpp, perplexity()): the whole file is
tokenized (with BOS when the model adds one), cut into non-overlapping chunks of -c tokens;
each chunk is evaluated from an empty cache, its first token replaced by BOS when the model
adds BOS; only the second half of each chunk is scored (every token there has at least c/2
tokens of context). The running estimate is printed after each chunk as [i]PPL, and the end
line is `Final estimate: PPL = X +/- Y`, Y being llama.cpp's standard error.

example:
  minfer perplexity -m smollm2-135m-instruct -f /usr/lib/python3.11/textwrap.py -c 512 --chunks 4
"""


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent

    return [engine_parent()]   # -m, --device, -c/--ctx-size (here: the chunk size), -t, -ngl


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", required=True, metavar="TEXT", help="the text file to score (UTF-8); '-' reads standard input")
    from minfer.commands.common import set_default

    # llama-perplexity's chunk size; -c sets it
    set_default(p, "ctx", 512, "tokens per scored chunk, as llama-perplexity's -c (default 512); checked "
                "against the memory the KV cache needs")
    p.add_argument("--chunks", type=int, default=-1, metavar="N",
                   help="score at most this many chunks (at least 1); -1 (or any negative count, as "
                   "llama-perplexity) = all (default)")


def score_chunk(eng, chunk: list[int]):
    """Negative log-likelihoods (float64) of tokens chunk[first+1 .. n-1], first = n // 2."""
    import torch

    n = len(chunk)
    first = n // 2
    eng.reset()
    logits = eng.forward(chunk, 0)                                  # (n, V)
    logp = torch.log_softmax(logits[first:n - 1].double(), -1)      # predicts chunk[first+1:]
    target = torch.tensor(chunk[first + 1:], dtype=torch.long)
    return -logp.gather(1, target[:, None]).squeeze(1)


def perplexity(eng, tokens: list[int], n_ctx: int, n_chunks: int, add_bos: bool, bos_id,
               out=None, progress: bool = True):
    """(ppl, stderr, per-chunk running ppl list) over the first n_chunks chunks of n_ctx tokens."""
    from tqdm import tqdm

    out = out or sys.stdout
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in tqdm(range(n_chunks), desc="perplexity", unit="chunk", disable=not progress, file=sys.stderr):
        chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
        if add_bos:
            chunk = [bos_id] + chunk[1:]
        x = score_chunk(eng, chunk)
        nll += float(x.sum())
        nll2 += float((x * x).sum())
        count += x.numel()
        running.append(math.exp(nll / count))
        print(f"[{i + 1}]{running[-1]:.4f},", end="", file=out, flush=True)
    print(file=out)
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else float("nan")
    return ppl, err, running


def _read_file(path) -> str:
    from minfer.errors import MinferError

    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise MinferError(f"{path}: no such file") from e
    except OSError as e:
        raise MinferError(f"{path}: cannot read the text file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise MinferError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def main(args) -> int:
    from pathlib import Path

    from minfer.commands.run import load_engine
    from minfer.errors import MinferError

    path = Path(args.file)
    # every check that needs no model comes before the load (seconds to minutes)
    if args.ctx < 4:
        raise MinferError(f"-c/--ctx-size {args.ctx}: expected at least 4 tokens a chunk")
    if not args.file:   # (an unset shell variable) was ".: a directory, not a text file"
        raise MinferError("-f/--file is empty: give the text file to score, or - for standard input")
    if args.chunks == 0:   # a negative count means all, as llama-perplexity's --chunks
        raise MinferError("--chunks 0: expected a number of chunks >= 1, or -1 (any negative count) for all")
    if args.file == "-":
        from minfer.limits import read_stdin

        text = read_stdin("the text")
    elif path.is_dir():
        raise MinferError(f"{path}: a directory, not a text file (-f/--file takes a file)")
    else:
        text = _read_file(path)
    eng = load_engine(args)
    where, name = ("standard input", "stdin") if args.file == "-" else (str(path), path.name)
    tok = eng.tokenizer
    from minfer.tokenizer.spm import UnspellableText

    try:
        tokens = tok.encode(text)   # with BOS when the model adds one, as llama.cpp's common_tokenize(.., true)
    except UnspellableText as e:   # name the text and where the character is, not only the model
        at = text.find(e.char)
        line = f", line {text.count(chr(10), 0, at) + 1}" if at >= 0 else ""
        raise MinferError(f"{where}{line}: the model's vocab cannot spell this text: {e}") from e
    n_ctx = args.ctx
    if len(tokens) < 2 * n_ctx:
        raise MinferError(f"{where}: {len(tokens)} tokens; perplexity with -c {n_ctx} needs at least "
                          f"{2 * n_ctx} (as llama-perplexity); use a longer text or a smaller -c")
    n_max = len(tokens) // n_ctx
    n_chunks = n_max if args.chunks < 0 else min(args.chunks, n_max)
    print(f"perplexity: {name}: {len(tokens)} tokens, {n_chunks} chunks of {n_ctx} "
          f"(scoring the last {n_ctx - n_ctx // 2 - 1} tokens of each)", file=sys.stderr)
    ppl, err, _ = perplexity(eng, tokens, n_ctx, n_chunks, tok.add_bos, tok.bos_id,
                             progress=sys.stderr.isatty())
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")
    return 0
