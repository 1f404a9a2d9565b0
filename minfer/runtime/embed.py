"""Embeddings: a text's hidden rows after the output norm, pooled and normalised.

    eng = minfer.load("Qwen3-Embedding-0.6B-Q8_0.gguf")
    vecs = eng.embed(["first text", "second text"])        # two lists of floats, unit length
    v = eng.embed("one text", pooling="mean", normalize=-1)   # one list, not normalised

What is computed, as llama.cpp computes it with embeddings on (src/llama-graph.cpp
build_pooling, common/common.cpp common_embd_normalize), so the same file gives the same vectors:
- the model's forward over the input's tokens from position 0, keeping each row's hidden state
  after the output norm: the lm head's input (Model.head; llama.cpp's `result_norm`, t_embd). The
  lm head itself is not run, and nothing an architecture does to its logits (scale, soft-cap)
  touches the vector;
- pooled as the file's `{arch}.pooling_type` says, or as the caller asks: "mean" (the rows'
  average), "cls" (the first row), "last" (the last row: Qwen3-Embedding), "none" (every row, a
  vector per token), "rank" (a reranker's classifier head, models/bert.py RankHead: on the first
  row of an encoder, the last row of a decoder (Qwen3-Reranker), its n_cls_out raw logits, or
  their softmax for qwen3 / qwen3vl; not normalised unless asked). A file without the key (a chat
  model) needs the caller's choice: there is no right default;
- cut to its first `dimensions` values where asked (Matryoshka models), then normalised (vLLM's
  order): normalize 2 euclidean (unit length, what OpenAI's API returns; the default), -1 none,
  0 scaled so the largest |value| is 32760 (an int16 range), 1 taxicab, p > 2 the p-norm
  (llama.cpp's embd_normalize values).

Texts are tokenized as llama.cpp's server does for /v1/embeddings: BOS / EOS as the file's
tokenizer metadata says (Qwen3-Embedding appends its EOS) and special tokens written in the text
parsed. Each input runs alone from position 0 in the engine's cache (the next generate() re-uses
no prefix of it unless it matches), within the engine's context: in prefill chunks, or in one forward
for an encoder (Model.causal False, bert: its attention sees the whole input and it has no cache).

Reranking (Engine.rerank, POST /v1/rerank, `minfer rerank`), as llama-server serves a cross-encoder
started with --reranking (pooling RANK):
- each (query, document) pair is one input, laid out as tools/server/server-common.cpp
  format_prompt_rerank does: with the file's `tokenizer.chat_template.rerank` ({query} and
  {document} replaced), that text tokenized with control-token texts parsed and no BOS/EOS added;
  else BOS if the vocab adds one, the query's tokens (no special tokens added, none parsed), EOS
  (SEP when the vocab has no EOS) if it adds EOS, SEP if it adds SEP, the document's tokens, EOS if
  it adds EOS. The add flags are llama_vocab_get_add_bos / _eos / _sep: the file's
  tokenizer.ggml.add_bos_token / add_eos_token / add_sep_token, else the vocab type's default
  (llama-vocab.cpp load: WordPiece adds SEP only; llama.cpp's converter writes add_bos and add_eos
  true with EOS = [SEP] for BERT: [CLS] query [SEP] document [SEP]);
- the pooled row (llama-graph.cpp build_pooling RANK, llm_graph_input_cls::set_input): an
  encoder's first token ([CLS]; or the rows' mean, classifier.pooling_type MEAN), a causal
  decoder's LAST token (Qwen3-Reranker: models/qwen3.py);
- the score is the classifier head's first output on the pair's pooled row (send_rerank: embd[0]),
  llama-server's relevance_score: a raw logit (no sigmoid) for a cross-encoder, the probability of
  "yes" (the softmax over yes / no that build_pooling applies for qwen3 / qwen3vl) for
  Qwen3-Reranker; results sorted by it, highest first (format_response_rerank), ties in input order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minfer.errors import MinferError
from minfer.models.base import HiddenTaken, Step

# llama.h enum llama_pooling_type (UNSPECIFIED -1 is the caller's "the file's")
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {v: k for k, v in POOLING.items()}


def pooling_of(cfg, pooling: str | None, where: str = "", how: str = "pass pooling='mean' or 'last'") -> str:
    """The pooling to use: the caller's name, else the file's `{arch}.pooling_type`; `how`: the fix
    the error names when there is neither (the API's keyword, a CLI's flag)."""
    if pooling is not None:
        if not isinstance(pooling, str) or pooling not in POOLING:
            raise MinferError(f"pooling: expected one of {', '.join(POOLING)} or None (the file's), "
                              f"got {pooling!r}"[:200])
        name = pooling
    elif cfg.pooling_type >= 0:
        name = POOLING_NAMES[cfg.pooling_type]
    else:
        from minfer.models import ARCHITECTURES

        # an encoder's converter may write no pooling (t5encoder's never does); a decoder's file is a generator's
        encoder = not getattr(ARCHITECTURES.get(cfg.arch), "causal", True)
        why = "" if encoder else ": not an embedding model's file"
        raise MinferError(f"{where or 'this model'}: the file names no pooling ({cfg.arch}.pooling_type is absent"
                          f"{why}), so say how to pool its hidden rows: {how}")
    return name


def rank_head_of(model, cfg, where: str = ""):
    """The model's classifier head (models/bert.py RankHead), or a MinferError saying it is not a reranker."""
    head = getattr(model, "rank_head", None)
    if head is None:
        pt = cfg.pooling_type
        raise MinferError(f"{where or 'this model'}: pooling 'rank' is not supported: this model is not a reranker "
                          f"(no classifier tensors cls / cls.output in the file, and {cfg.arch}.pooling_type is "
                          f"{POOLING_NAMES.get(pt, pt) if pt >= 0 else 'absent'}); a reranker's GGUF converted by "
                          "llama.cpp (a cross-encoder such as ms-marco-MiniLM, or Qwen3-Reranker) has them. For "
                          "embeddings use 'mean', 'cls', 'last' or 'none'")
    return head


def pair_ids(tok, head, query: str, doc: str) -> list[int]:
    """A (query, document) pair's tokens as llama-server's format_prompt_rerank lays them out (module doc)."""
    meta = head.pair_meta or {}
    template = meta.get("tokenizer.chat_template.rerank")
    if isinstance(template, str):      # llama_model_chat_template(model, "rerank"): tokenize(prompt, false, true)
        return tok.encode(template.replace("{query}", query).replace("{document}", doc), add_bos=False,
                          parse_special=True)

    def flag(key: str, default: bool) -> bool:
        v = meta.get(f"tokenizer.ggml.{key}")
        return default if v is None else bool(v)

    wpm = tok.kind == "wpm"          # llama-vocab.cpp load: "bert" sets add_sep only; else as minfer's vocab says
    add_bos = flag("add_bos_token", False if wpm else tok.add_bos)
    add_eos = flag("add_eos_token", False if wpm else tok.add_eos)
    add_sep = flag("add_sep_token", tok.add_sep_default)   # load(): WordPiece; BPE jina-v1-en / -v2-code, roberta-bpe
    eos = tok.eos_id if tok.eos_id is not None else tok.sep_id      # "use SEP token as fallback if EOS is not available"
    need = [(add_bos, tok.bos_id, "BOS (tokenizer.ggml.bos_token_id)"), (add_eos, eos, "EOS or SEP"),
            (add_sep, tok.sep_id, "SEP (tokenizer.ggml.seperator_token_id)")]
    for on, tid, what in need:
        if on and tid is None:
            raise MinferError(f"{tok.path}: the rerank layout adds a {what} token, which the vocab does not have")
    q = tok.encode(query, add_bos=False, parse_special=False)
    d = tok.encode(doc, add_bos=False, parse_special=False)
    return ([tok.bos_id] if add_bos else []) + q + ([eos] if add_eos else []) + ([tok.sep_id] if add_sep else []) \
        + d + ([eos] if add_eos else [])


@dataclass
class Reranked:
    """Engine.rerank's answer. scores[i]: document i's relevance score (the head's first output);
    ranking: (index, score) highest first, cut to top_n; n_tokens[i]: the tokens of pair i."""
    scores: list[float]
    ranking: list[tuple[int, float]]
    n_tokens: list[int]


def check_normalize(normalize) -> int:
    if isinstance(normalize, bool) or not isinstance(normalize, int) or normalize < -1:
        raise MinferError(f"normalize: expected an integer >= -1 (2 euclidean, -1 none, 0 int16 range, 1 taxicab, "
                          f"p > 2 p-norm), got {normalize!r}"[:200])
    return normalize


def normalise(v: torch.Tensor, mode: int) -> torch.Tensor:
    """common_embd_normalize's rule on the last dimension (float64 sums, as its double)."""
    if mode == -1:
        return v
    a = v.double()
    if mode == 0:
        s = a.abs().amax(-1, keepdim=True) / 32760.0
    elif mode == 2:
        s = a.pow(2).sum(-1, keepdim=True).sqrt()
    else:
        s = a.abs().pow(mode).sum(-1, keepdim=True).pow(1.0 / mode)
    scale = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    return (v.float() * scale.float())


def pool(rows: torch.Tensor, name: str) -> torch.Tensor:
    """rows (T, D) float32 -> (D,) for mean / cls / last, (T, D) for none."""
    if name == "mean":
        return rows.double().mean(0).float()
    if name == "cls":
        return rows[0]
    if name == "last":
        return rows[-1]
    return rows


class Embeddings:
    """Engine.embed (a mixin: the Engine's module stays one screenful shorter)."""

    def embed(self, inputs, pooling: str | None = None, normalize: int = 2, dimensions: int | None = None):
        """Embedding vectors of `inputs`: a str (-> one list of floats), a list of token ids (-> one
        list), or a list of those (-> a list of lists). pooling: 'mean', 'cls', 'last', 'none' (a
        vector per token) or None (the file's `pooling_type`). normalize: llama.cpp's embd_normalize
        (2 euclidean, the default; -1 none). dimensions: keep the first n values (before the
        normalisation). See minfer/runtime/embed.py."""
        self._live()
        where = str(self.path) if self.path else ""
        name = pooling_of(self.config, pooling, where)
        head = rank_head_of(self.model, self.config, where) if name == "rank" else None
        normalize = check_normalize(normalize)
        single, ids_list = self._embed_inputs(inputs)
        D = self.config.d_model if head is None else head.n_out
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= D):
            raise MinferError(f"dimensions: expected an integer in 1..{D} (the model's width), "
                              f"got {dimensions!r}"[:160])
        with self._busy():
            out = [self._embed_one(ids, name, i if not single else None, head) for i, ids in enumerate(ids_list)]
        vecs = []
        for v in out:
            if dimensions is not None:
                v = v[..., :dimensions]
            vecs.append(normalise(v, normalize).tolist())
        return vecs[0] if single else vecs

    def rerank(self, query: str, documents, top_n: int | None = None) -> Reranked:
        """Score each document's relevance to `query` with a reranker (a cross-encoder's or Qwen3-Reranker's
        GGUF: a classifier head, pooling 'rank'), as llama-server's /v1/rerank does (module doc). Returns Reranked:
        scores in the documents' order, ranking sorted highest first (cut to top_n), tokens per pair."""
        self._live()
        where = str(self.path) if self.path else ""
        head = rank_head_of(self.model, self.config, where)
        if self.tokenizer is None:
            raise MinferError("rerank needs a tokenizer, and this engine has none")
        if not isinstance(query, str):
            raise MinferError(f"query: expected a string, got {type(query).__name__}")
        if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not documents:
            raise MinferError("documents: expected a non-empty list of strings")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise MinferError(f"top_n: expected an integer >= 1 or None (all), got {top_n!r}"[:120])
        ids_list = []
        for i, d in enumerate(documents):
            if not isinstance(d, str):
                raise MinferError(f"documents[{i}]: expected a string, got {type(d).__name__}")
            ids = pair_ids(self.tokenizer, head, query, d)
            if not ids:
                raise MinferError(f"documents[{i}]: the pair has no tokens (an empty query and document)")
            if len(ids) > self.n_ctx:
                raise MinferError(f"documents[{i}]: the query and document are {len(ids)} tokens, more than the "
                                  f"context of {self.n_ctx}; use a larger context (minfer.load(ctx=N), --ctx N) or a "
                                  "shorter document")
            ids_list.append(ids)
        with self._busy():
            scores = [float(self._embed_one(ids, "rank", i, head)[0]) for i, ids in enumerate(ids_list)]
        return ranked(scores, [len(x) for x in ids_list], top_n)

    def _embed_inputs(self, inputs) -> tuple[bool, list[list[int]]]:
        from minfer.runtime.generate import check_prompt_ids

        def encode(t, name):
            if isinstance(t, str):
                if self.tokenizer is None:
                    raise MinferError("embed(text) needs a tokenizer, and this engine has none; pass token ids")
                return self.tokenizer.encode(t, parse_special=True)
            return check_prompt_ids(t, name)

        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                       and not isinstance(inputs[0], (str, list, tuple, torch.Tensor))):
            single, items = True, [inputs]
        elif isinstance(inputs, (list, tuple)) and inputs:
            single, items = False, list(inputs)
        else:
            raise MinferError(f"inputs: expected a str, a list of token ids, or a non-empty list of those, got "
                              f"{type(inputs).__name__} {inputs!r}"[:160])
        ids_list = []
        for i, t in enumerate(items):
            name = "inputs" if single else f"inputs[{i}]"
            ids = encode(t, name)
            if not ids:
                raise MinferError(f"{name}: no tokens to embed (an empty text, and the model adds no BOS)")
            if len(ids) > self.n_ctx:
                raise MinferError(f"{name}: {len(ids)} tokens do not fit in the context of {self.n_ctx}; use a "
                                  "larger context (minfer.load(ctx=N), --ctx N) or a shorter input")
            bad = [x for x in ids if not 0 <= x < self.config.vocab]
            if bad:
                raise MinferError(f"{name}: token id {bad[0]} is outside the vocabulary of {self.config.vocab}")
            ids_list.append(ids)
        return single, ids_list

    def _embed_one(self, ids: list[int], name: str, index: int | None, head=None) -> torch.Tensor:
        """The pooled, un-normalised vector (D,) float32 on the CPU ((T, D) for 'none'; for 'rank' the head's
        n_cls_out outputs on the first row (an encoder), the last row (a causal decoder), or the rows' mean when
        the head says so)."""
        # build_pooling RANK: the cls row (llm_graph_input_cls::set_input: the smallest position for a non-causal
        # model, the largest for a causal one: Qwen3-Reranker), or the mean (classifier.pooling_type MEAN)
        if name == "rank":
            row = self._embed_one(ids, "mean" if head.mean else ("cls" if not getattr(self.model, "causal", True)
                                                                  else "last"), index)
            return head(row)
        from minfer.runtime.cuda_graphs import inference_scope

        self._epoch += 1
        self.tokens = []
        model = self.model
        rows: list[torch.Tensor] = []
        # an encoder's attention (Model.causal False: bert) sees the whole input: one forward, never chunks
        chunk_len = self.prefill_chunk() if getattr(model, "causal", True) else len(ids)
        want = "last" if name == "last" else "all"
        model.hidden_sink = lambda h: rows.append(h.float())
        try:
            with inference_scope():
                for i in range(0, len(ids), chunk_len):
                    chunk = ids[i:i + chunk_len]
                    t = torch.tensor(chunk, dtype=torch.long, device=self.device)
                    try:
                        model.forward(t, Step.at(i, len(chunk), self.device, want), self.cache, self.ctx)
                    except HiddenTaken:
                        pass
                    else:   # a forward that ends without Model.head: its hidden rows were never seen
                        raise MinferError(f"{self.config.arch}: the forward did not pass its hidden rows to the "
                                          "head, so it cannot embed")
                    if name == "cls":     # the first chunk holds the row: the rest would be computed for nothing
                        rows[1:] = []
                        ids = ids[:i + len(chunk)]
                        break
                    if name == "last":
                        rows[:-1] = []
        finally:
            model.hidden_sink = None
        self.tokens = list(ids)       # what the cache holds now
        allrows = torch.cat(rows) if len(rows) > 1 else rows[0]
        if not torch.isfinite(allrows).all():
            where = "" if index is None else f" of inputs[{index}]"
            raise MinferError(f"the hidden rows{where} are not finite (NaN or inf): the model's weights or the "
                              "activations' dtype overflowed; try MINFER_ACT_DTYPE=float32")
        out = pool(allrows, name)
        post = getattr(model, "post_pool", None)   # layers after the pooling (gemma-embedding's Dense: build_dense_out)
        return (out if post is None else post(out)).cpu()


class NoCache:
    """An encoder's stand-in for the KV cache (Model.causal False: bert): its attention sees the whole input in
    one forward and keeps nothing, as llama.cpp creates no memory for BERT-family encoders
    (llama-model.cpp llama_model::create_memory: LLM_ARCH_BERT, NOMIC_BERT, MODERN_BERT, ... -> nullptr). Holds
    no tensor; it carries the context (--ctx) a step's position checks read (StarcoderModel.check_positions)."""

    states = None

    def __init__(self, n_ctx: int):
        self.n_ctx = self.context = n_ctx

    def nbytes(self) -> int:
        return 0


def engine_cache(model, n_ctx: int, device):
    """The Engine's cache: NoCache for an encoder (Model.causal False), else the KV cache of n_ctx positions."""
    from minfer.runtime.kv_cache import KVCache, cache_rows

    if not getattr(model, "causal", True):
        return NoCache(n_ctx)
    return KVCache.for_config(model.cfg, cache_rows(n_ctx, device), device, dtype=model.act_dtype, context=n_ctx)


def cache_note(eng) -> str:
    """The load report's words on the cache."""
    c = eng.cache
    if isinstance(c, NoCache):
        return f"no KV cache (an encoder; {eng.n_ctx} positions)"
    return (f"KV cache {c.nbytes() / 2**20:.0f} MiB ({eng.n_ctx} positions"
            f"{'' if c.n_ctx == eng.n_ctx else f' in {c.n_ctx} rows'}, {str(eng.model.act_dtype).removeprefix('torch.')})")


def embedding_bytes(vec: Sequence[float]) -> bytes:
    """A vector as little-endian float32 bytes (OpenAI's encoding_format 'base64')."""
    import struct

    return struct.pack(f"<{len(vec)}f", *vec)


def ranked(scores: list[float], n_tokens: list[int], top_n: int | None = None) -> Reranked:
    """Reranked of scores: the ranking highest first (format_response_rerank's sort; ties in input order)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if top_n is not None:
        order = order[:top_n]
    return Reranked(list(scores), [(i, scores[i]) for i in order], list(n_tokens))
