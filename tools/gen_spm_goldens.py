"""Write tests/tokenizer/goldens/<name>-sentencepiece.json: SentencePiece vocab ids from
Google's `sentencepiece` library, an implementation independent of minfer and of llama.cpp.

A GGUF SentencePiece vocab (tokenizer.ggml.model 'llama': tokens, scores, token types) is
turned back into a sentencepiece BPE ModelProto (identity normalizer, spaces escaped to
U+2581, the dummy prefix as tokenizer.ggml.add_space_prefix says, byte fallback), and
`SentencePieceProcessor.encode` tokenizes the strings of tools/gen_token_goldens.py. llama.cpp's
SPM tokenizer is a port of sentencepiece's BPE model: on llama.cpp's own suite file
ggml-vocab-llama-spm.gguf this reproduces all 46 lines of its .out (checked by `--check`).

llama.cpp cuts user-defined tokens out of the text before the merges (tokenizer_st_partition,
also with parse_special=false); sentencepiece never sees those texts as such (its
normalizer turns their spaces into U+2581 first), so the user-defined texts are cut out here
too, leftmost and longest first, before sentencepiece runs on the pieces between them. Tokens
that llama.cpp turns into control tokens by their text (its end-of-generation list: </s> ...)
are not cut out with parse_special=false, as in llama.cpp.

Needs `sentencepiece` and `protobuf` (not minfer dependencies):

    python tools/gen_spm_goldens.py gemma-3-270m
    python tools/gen_spm_goldens.py --check        # the llama-spm suite file against .out
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE.parent / "tests" / "tokenizer" / "goldens"
# texts llama.cpp forces to CONTROL (llama-vocab.cpp: the end-of-generation text list); the
# ones a SentencePiece vocab may hold as user-defined
_FORCED_CONTROL = {"</s>", "<eos>", "<end_of_turn>", "<|endoftext|>", "<|im_end|>", "<|end|>",
                   "<|eot_id|>", "<EOT>"}


def processor(path: Path):
    """(sentencepiece processor, tokens, token types, metadata) of a GGUF SPM vocab."""
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    r = gguf.GGUFReader(str(path))

    def f(k):
        return r.fields[k].contents() if k in r.fields else None

    if f("tokenizer.ggml.model") != "llama":
        raise SystemExit(f"{path}: not a SentencePiece vocab")
    toks, scores, types = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.scores"), f("tokenizer.ggml.token_type")
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    unk = f("tokenizer.ggml.unknown_token_id")
    m.trainer_spec.unk_id = 0 if unk is None else unk
    m.trainer_spec.bos_id = m.trainer_spec.eos_id = m.trainer_spec.pad_id = -1
    m.normalizer_spec.name = "identity"
    prefix = f("tokenizer.ggml.add_space_prefix")
    m.normalizer_spec.add_dummy_prefix = True if prefix is None else bool(prefix)
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (t, s, ty) in enumerate(zip(toks, scores, types)):
        p = m.pieces.add()
        p.piece, p.score = t, s
        # sentencepiece allows one UNKNOWN piece: any other is a control piece (never merged);
        # llama.cpp makes the end-of-generation texts control tokens
        p.type = 3 if (ty == 2 and i != m.trainer_spec.unk_id) or t in _FORCED_CONTROL else ty
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    return sp, toks, types


def reference_ids(sp, toks, types, text: str) -> list[int]:
    """ids of llama_tokenize(add_special=false, parse_special=false), by sentencepiece."""
    ud = sorted({t for t, ty in zip(toks, types) if ty == 4 and t not in _FORCED_CONTROL},
                key=len, reverse=True)
    tid = {t: i for i, t in enumerate(toks)}
    out, pos = [], 0
    if ud:
        for m in re.finditer("|".join(re.escape(u) for u in ud), text):
            if m.start() > pos:
                out += sp.encode(text[pos:m.start()])
            out.append(tid[m.group()])
            pos = m.end()
    if pos < len(text):
        out += sp.encode(text[pos:])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="catalog names or GGUF paths")
    ap.add_argument("--check", action="store_true", help="compare with llama.cpp's llama-spm .out")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import fetch_llama_cpp
    from gen_token_goldens import CASES, fuzz_cases, sweep_cases, write_golden

    if args.check:
        d = fetch_llama_cpp.suite_dir()
        sp, toks, types = processor(d / "ggml-vocab-llama-spm.gguf")
        cases = fetch_llama_cpp.read_cases(d, "llama-spm")
        ok = sum(reference_ids(sp, toks, types, t) == ids for t, ids in cases)
        print(f"llama-spm: {ok}/{len(cases)} texts give llama.cpp's ids")
        return 0 if ok == len(cases) else 1
    from minfer.catalog import resolve_model

    for name in args.models:
        path = Path(resolve_model(name))
        sp, toks, types = processor(path)
        strings = CASES + fuzz_cases(60) + sweep_cases()[::4]
        g = {"reference": f"sentencepiece {__import__('sentencepiece').__version__} "
                          "(BPE ModelProto rebuilt from the GGUF vocab)",
             "file": path.name, "n_vocab": len(toks),
             "cases": [{"text": s, "ids_no_special": reference_ids(sp, toks, types, s)} for s in strings]}
        out = write_golden(f"{name}-sentencepiece", "{\n" + ",\n".join(
            f" {json.dumps(k)}: " + (
                "[\n  " + ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in v) + "\n ]"
                if k == "cases" else json.dumps(v, ensure_ascii=False)) for k, v in g.items()) + "\n}\n")
        print(f"{out}: {len(g['cases'])} strings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
