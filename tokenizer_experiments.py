"""
The handout's tokenizer_experiments (section 2.7), measured for experiments.py's report: the runs' tokenizer's
compression (bytes/token) on validation documents and on another domain's text, against that text's own tokenizer;
its throughput, and the hours it would take to tokenize the Pile; why its ids are stored as uint16. Optional reading:
`python experiments.py tokenizer` measures the figures once (tokenizer_figures) and answers from them.

1. The documents, and another domain's text and tokenizer
2. The figures, measured once and kept
3. The answers
"""
import collections
import math
import os
import sys
from pathlib import Path

import accounting
import bpe
import bpe_fast
import cli
import data
import files

DOCUMENTS = 10  # tokenizer_experiments (a): documents sampled for the compression ratio
QUESTIONS = ["tokenizer_experiments (a): the tokenizer's compression ratio (bytes/token) on 10 documents?",  # report's
             "tokenizer_experiments (b): the tokenizer on another domain's text, against that text's own?",
             "tokenizer_experiments (c): its throughput, and the time to tokenize the Pile (825 GiB)?",
             "tokenizer_experiments (d): why are the token ids stored as uint16?"]


# ----------------------------------------------------------------------------
# 1. The documents, and another domain's text and tokenizer

OTHER = {"tinystories": "owt", "owt": "tinystories"}  # tokenizer_experiments (b): the handout's pairing


def documents(text, limit):
    """The first DOCUMENTS non-empty documents of text (its first `limit` characters). A first document longer than
    the limit (a text without <|endoftext|>: enwik8) is measured as the piece read: none would divide 0 by 0."""
    docs = [d for d in text.split(data.EOT)[:-1 if len(text) == limit else None] if d.strip()][:DOCUMENTS]
    return docs or [d for d in text.split(data.EOT) if d.strip()][:1]


def other_domain(cfg, limit):
    """tokenizer_experiments (b)'s other text and its own tokenizer -> (name, documents, tokenizer). The handout's
    other dataset (TinyStories <-> OpenWebText) where its tokenizer is in the data cache; else Python's standard
    library source, code against the runs' prose, in every Python: a module is a document, the first DOCUMENTS are
    measured and a BPE of the runs' vocabulary size is trained on the next `limit` characters. None for --data
    python, which holds both of the texts every Python carries (a tester found (b) measured on the runs' own modules)."""
    if cfg["data"] == "python":
        return None
    if other := OTHER.get(cfg["data"]):
        folder = data.cache_dir(other, cfg["data_dir"])
        found, valid = sorted(folder.glob("bpe*/vocab.json")), folder / data.text_names(other)[1]
        if found and valid.is_file():
            with open(valid, encoding="utf-8") as f:
                text = f.read(limit)
            return f"{other}'s validation text", documents(text, limit), data.read_tokenizer(found[0].parent)[0]
    modules = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(Path(os.__file__).parent.glob("*.py"))]
    if len(modules) <= DOCUMENTS:  # some distributions ship the standard library compiled only
        raise cli.DataError(f"tokenizer_experiments (b) takes its other text from Python's standard library "
                               f"source, and {Path(os.__file__).parent} has {len(modules)} .py files; use a Python "
                               "with its source (python.org's or a venv of it).")
    train_text = "".join(modules[DOCUMENTS:])[:limit]
    counts = collections.Counter(bpe.pretokenize(train_text))
    vocab, merges = bpe.train_from_counts(counts, cfg["vocab_size"], [data.EOT])
    return "Python's standard library source", modules[:DOCUMENTS], bpe.Tokenizer(vocab, merges, [data.EOT])


# ----------------------------------------------------------------------------
# 2. The figures, measured once and kept

def bytes_per_token(tok, docs):  # ["ab c", ...] -> bytes of the documents / tokens tok makes of them
    return sum(len(d.encode()) for d in docs) / sum(len(tok.encode(d)) for d in docs)


NUMBERS = ("documents", "bytes", "vocab", "tokens", "other_documents", "other_vocab", "text_bytes", "ours_on_other",
           "other_on_ours", "other_on_other", "bytes_per_s")  # tokenizer_figures' figures, each above 0


def stored_figures(path, made_for):
    """tokenizer_figures' kept figures, or None: none yet, of other data, or a file cut or edited (measured again; a
    traceback of json's, or answer_tokenizer's KeyError or division by 0, before 2026-12-01)."""
    try:
        f = files.load_json(path.read_text(encoding="utf-8"), path) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    ok = isinstance(f, dict) and f.get("made_for") == made_for and all(type(f.get(k)) is str for k in ("dtype", "other"))
    numbers = [k for k in NUMBERS if f.get("other") or not k.startswith(("other_", "ours_on"))] if ok else []
    return f if ok and all(type(f.get(k)) in (int, float) and 0 < f[k] < math.inf for k in numbers) else None


def tokenizer_figures(tok, ids, cfg, path, made_for, limit=1 << 22):
    """The figures of tokenizer_experiments, measured once per data (made_for: data.fingerprint, its token files
    and tokenizer) and kept in path: the runs' tokenizer on the first DOCUMENTS validation documents (of the first
    `limit` characters) and on another domain's (other_domain), that domain's tokenizer on both, and the runs'
    tokenizer's speed on the first `limit` characters of the training text (one process)."""
    if kept := stored_figures(path, made_for):
        return kept
    folder, (train_name, valid_name) = data.cache_dir(cfg["data"], cfg["data_dir"]), data.text_names(cfg["data"])
    with open(folder / valid_name, encoding="utf-8") as f:
        docs = documents(f.read(limit), limit)
    with open(folder / train_name, encoding="utf-8") as f:
        text = f.read(limit)
    other, other_docs, other_tok = other_domain(cfg, limit) or ("", None, None)
    bpe_fast.load_compiled_encoder()  # the engine, which encode takes once loaded: its speed, not numba's compile
    figures = dict(made_for=made_for, documents=len(docs), bytes=sum(len(d.encode()) for d in docs),
                   vocab=len(tok.vocab), tokens=sum(len(tok.encode(d)) for d in docs), dtype=str(ids.dtype),
                   other=other, text_bytes=len(text.encode()), bytes_per_s=accounting.encode_speed(tok, text, 1.0)[0])
    if other:
        figures.update(other_documents=len(other_docs), other_vocab=len(other_tok.vocab),
                       ours_on_other=bytes_per_token(tok, other_docs), other_on_ours=bytes_per_token(other_tok, docs),
                       other_on_other=bytes_per_token(other_tok, other_docs))
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(figures, path)
    return figures


# ----------------------------------------------------------------------------
# 3. The answers

def answer_tokenizer(f):
    seconds = accounting.PILE_BYTES / f["bytes_per_s"]
    ours, cost = f["bytes"] / f["tokens"], f["other"] and f["other_on_other"] / f["ours_on_other"] - 1
    some = "" if f["documents"] >= DOCUMENTS else f" (all the validation text has, of the {DOCUMENTS} asked)"
    return [f"(a) {ours:.2f} bytes/token: {cli.counted(f['documents'], 'validation document')}"
            f"{some}, {f['bytes']:,} bytes in {f['tokens']:,} tokens of the runs' {f['vocab']:,}-token BPE.",
            f"(b) on {f['other']} ({cli.counted(f['other_documents'], 'document')}), the "
            f"runs' BPE makes {f['ours_on_other']:.2f} bytes/token and that text's own {f['other_vocab']:,}-token BPE "
            f"{f['other_on_other']:.2f}: out of its domain it needs {abs(cost):.0%} {'more' if cost >= 0 else 'fewer'} "
            f"tokens; the other BPE on the runs' documents makes {f['other_on_ours']:.2f} (against {ours:.2f})."
            if f["other"] else "(b) not measured: --data python holds both of the texts every Python carries, its "
            "documentation and its standard library's source, so neither is out of the runs' domain (--data pydoc "
            "measures the source against the documentation; tinystories and owt each other, once both are cached).",
            f"(c) {f['bytes_per_s'] / 1e6:.2f} MB/s (Tokenizer.encode, one process, {f['text_bytes'] / 1e6:.2f} MB of "
            f"training text, the compiled engine); the Pile's {accounting.PILE_BYTES / accounting.GiB:.0f} GiB: "
            f"{seconds / 3600:,.1f} hours ({seconds / 86400:.2f} days) in one process (`bpe.py encode` splits a file "
            "over the CPU's cores).",
            f"(d) the {f['vocab']:,} ids are below 2^16 = 65,536, so each fits uint16's 2 bytes (these token files: "
            f"{f['dtype']}), half of int32's." if f["vocab"] <= 1 << 16 else f"(d) {f['vocab']:,} ids pass 2^16 = "
            f"65,536, uint16's range, so these token files hold {f['dtype']}: a vocabulary of up to 65,536 halves "
            "them."]


if __name__ == "__main__":  # a module of experiments.py's report, run by name: said, where it ended in silence
    cli.say("tokenizer_experiments.py: error: it measures for experiments.py's report; run python experiments.py "
            "tokenizer.", file=sys.stderr)
    raise SystemExit(2)
