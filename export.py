"""Export a trained run to the Hugging Face format: transformers loads it with no custom code.

What it teaches:
- The CS336 model is a Llama: pre-norm RMSNorm, RoPE, SwiGLU, no biases. Only the names differ
  (layers.0.attn.q_proj -> model.layers.0.self_attn.q_proj, ffn.w1/w3/w2 -> mlp.gate/up/down_proj)
  and one layout: model.py's RoPE rotates adjacent pairs (x[2k], x[2k+1]), HF's Llama rotates
  the two halves (x[k], x[k + d_head/2]). Reordering the rows of W_Q and W_K in each head (even
  rows first, then odd ones) turns one into the other; q.k is unchanged, both get the same order.
- safetensors is three things: an 8-byte little-endian header length, a JSON header giving
  each tensor's dtype, shape and byte range, then the raw bytes.
- The tokenizer is GPT-2's byte-level BPE: bpe.py's vocab.json and merges.txt (Tokenizer.save)
  plus a tokenizer_config.json that names the class and the special tokens' ids, and the same
  tokenizer as one tokenizer.json, the `tokenizers` library's format (PreTrainedTokenizerFast's).

Run:  python train.py --export hf/python    # the run in out/python: pass the training run's --out-dir/--run-name
      python export.py out/python hf/python  # the same, the run named by its directory
      python -c "import transformers as t; print(t.pipeline('text-generation', model='hf/python')('The')[0])"
train.py --export and main() call export_run; tests: python -m pytest -q test_all.py -k export
It lives apart from train.py: optional (transformers is needed only to load the export, not to write it), and the
same for both commands.
"""
import contextlib
import importlib.util
import inspect
import json
import os
from pathlib import Path

import cli  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("export.py")
import torch

from bpe import GPT2_PAT, Tokenizer, _token_to_str
from checkpoints import check_state
from cli import DataError, Parser, UsageError, catch_ctrl_c, disk_full, disk_is_full, exit_code, log
from config import model_kwargs, undecodable_ids
from data import read_tokenizer
from files import atomic_file, atomic_files, dir_lock, new_folders, unwritable, writable, write_json
from model import RMSNorm, TransformerLM
from rundir import RUN_MARKERS, diverged_step, on_text, read_run

# ----------------------------------------------------------------------------
# 1. The model as a Llama: names, the RoPE layout, config.json

# Ablations that LlamaForCausalLM has no switch for, with what they change.
NOT_LLAMA = {"no_norm": "no RMSNorm", "post_norm": "normalization after the residual add",
             "nope": "no RoPE", "silu_ffn": "an ungated SiLU feed-forward"}

# Per layer: model.py's name -> LlamaForCausalLM's name (w1 is the gate, silu(w1 x) * w3 x).
LLAMA_NAMES = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
               "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.o_proj",
               "ffn.w1": "mlp.gate_proj", "ffn.w3": "mlp.up_proj", "ffn.w2": "mlp.down_proj",
               "ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
ROTATED = ("attn.q_proj", "attn.k_proj")  # the weights that RoPE's layout touches


def rope_halves(w, num_heads):
    """Rows of W_Q or W_K (d_model, d_model) reordered in each head, even rows first: the pair
    (2k, 2k+1) that model.py rotates lands on (k, k + d_head/2), the pair HF's Llama rotates,
    with the same angle pos * theta^(-2k/d_head). Example, d_head 4: rows 0 1 2 3 -> 0 2 1 3."""
    d_head = w.shape[0] // num_heads
    order = torch.cat([torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)])
    return w.reshape(num_heads, d_head, -1)[:, order].reshape(w.shape)


def llama_weights(sd, num_layers, num_heads, tied):
    """model.py's state dict -> {LlamaForCausalLM's name: float32 tensor on the CPU}."""
    out = {"model.embed_tokens.weight": sd["token_embeddings.weight"], "model.norm.weight": sd["ln_final.weight"]}
    if not tied:  # tied: HF points lm_head at embed_tokens itself (safetensors stores no tensor twice)
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(num_layers):
        for ours, theirs in LLAMA_NAMES.items():
            w = sd[f"layers.{i}.{ours}.weight"]  # RoPE turns q and k only
            out[f"model.layers.{i}.{theirs}.weight"] = rope_halves(w, num_heads) if ours in ROTATED else w
    return {name: w.detach().to("cpu", torch.float32).contiguous() for name, w in out.items()}


def llama_config(a, eot_id):
    """config.json for TransformerLM's arguments a (every ablation off but tie_embeddings)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": a["vocab_size"],
            "hidden_size": a["d_model"], "intermediate_size": a["d_ff"], "num_hidden_layers": a["num_layers"],
            "num_attention_heads": a["num_heads"], "num_key_value_heads": a["num_heads"],  # no grouped-query attention
            "head_dim": a["d_model"] // a["num_heads"], "max_position_embeddings": a["context_length"],
            "rms_norm_eps": RMSNorm(1).eps, "rope_theta": a["rope_theta"], "hidden_act": "silu",
            "tie_word_embeddings": a["tie_embeddings"], "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32", "bos_token_id": eot_id, "eos_token_id": eot_id}


def generation_config(eot_id, tok, vocab_size, context_length):
    """generation_config.json: generate() stops at eot_id, or where the trained context is full (without a limit, a
    pipeline() ran past it, with transformers' warning), and never picks an id that tok cannot decode (a model
    trained on ids with a larger vocab_size than its tokenizer's, such as GPT-2's 50257 tokens padded to 50304:
    transformers' decode would drop such an id without a word). transformers reads this file before config.json."""
    gaps = undecodable_ids(tok, vocab_size) if tok is not None else []
    return {"bos_token_id": eot_id, "eos_token_id": eot_id, "max_length": context_length,
            **({"suppress_tokens": gaps} if gaps else {})}


# ----------------------------------------------------------------------------
# 2. safetensors, written by hand

def save_safetensors(tensors, path):
    """{name: contiguous float32 CPU tensor} -> path. Example: {"w": torch.ones(2)} -> the header's
    length, {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    padded with spaces to a multiple of 8, then w's 8 bytes (offsets count from the end of the header)."""
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + t.numel() * t.element_size()]}
        at = header[name]["data_offsets"][1]
    head = json.dumps(header).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the format allows trailing spaces: the bytes then start 8-byte aligned
    with atomic_file(path) as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for t in tensors.values():
            f.write(t.numpy().astype("<f4", copy=False).tobytes())  # little-endian whatever the machine's order


# ----------------------------------------------------------------------------
# 3. The tokenizer: GPT-2's files and what transformers needs to know about them

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json")


def added_token(content):  # a special token as transformers' files describe it: split off before BPE, never merged
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
            "special": True}


def tokenizers_json(tok, ids):
    """tok as the `tokenizers` library's tokenizer.json, ids: {special token: its id}. The special tokens are cut out
    first (added_tokens, longest first, as bpe.py's split), the rest split by bpe.py's GPT-2 regex, each piece's bytes
    spelt in GPT-2's byte alphabet (ByteLevel, its own copy of the regex off), then BPE with vocab.json's ids and
    merges.txt's merges in order. Example: "hi<|endoftext|>" -> "hi", then <|endoftext|>'s id."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    return {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
            "added_tokens": [{"id": i, **added_token(s)} for s, i in ids.items()],
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": GPT2_PAT}, "behavior": "Isolated", "invert": False}, level]},
            "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {_token_to_str(tok.vocab[i]): i for i in sorted(tok.vocab)},
                      "merges": [f"{_token_to_str(a)} {_token_to_str(b)}" for a, b in tok.merges]}}


def save_tokenizer(tok, paths, context_length):
    """bpe.Tokenizer -> GPT-2's files (bpe.py's writer) and what AutoTokenizer needs to load them
    as GPT2Tokenizer, whose BPE takes the ids from vocab.json and the merge ranks from the order of
    merges.txt, and PreTrainedTokenizerFast (tokenizer.json); paths: where TOKENIZER_FILES go. The first special token
    (train.py's <|endoftext|>) is bos, eos and unk: its id. The others are additional_special_tokens: transformers 4's
    GPT2Tokenizer (use_fast=False) decoded an added token that is none of its special tokens with spaces around it
    ("a <|pad|> b" for "a<|pad|>b"), and kept it under skip_special_tokens."""
    vocab, merges, config, fast = paths
    tok.save(vocab, merges)
    ids = {s: tok.encode(s)[0] for s in tok.special_tokens}  # a special token encodes to its own id
    first = tok.special_tokens[0] if tok.special_tokens else None
    names = {"bos_token": first, "eos_token": first, "unk_token": first,
             "additional_special_tokens": [s for s in ids if s != first]}
    added = {str(i): added_token(s) for s, i in ids.items()}
    write_json({"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "add_bos_token": False,
                "model_max_length": context_length, "clean_up_tokenization_spaces": False, **names,
                "added_tokens_decoder": added}, config)
    write_json(tokenizers_json(tok, ids), fast)
    return ids.get(first)


def fitting_tokenizer(tok, vocab_size):
    """The tokenizer that the export of a model with vocab_size carries: tok without its special tokens at ids from
    vocab_size on, which no training id was (read_tokenizer's <|endoftext|>, added after a vocab that lacks it).
    ValueError if other ids reach that far, or if transformers would give a special token another id."""
    past = {i: s for s in tok.special_tokens if (i := tok.encode(s)[0]) >= vocab_size}
    if past:
        tok = Tokenizer({i: b for i, b in tok.vocab.items() if i not in past}, tok.merges,
                        [s for s in tok.special_tokens if s not in past.values()])
    if (top := max(tok.vocab)) >= vocab_size:  # ids trained with any tokenizer
        raise ValueError(f"the tokenizer's ids reach {top}, past the model's vocab_size {vocab_size}, so "
                         "transformers would look up embeddings the model lacks; export the model alone (train.py: "
                         "move the run's vocab.json and merges.txt away)")
    for s in tok.special_tokens:  # transformers finds a special token by its text, vocab.json spells it in GPT-2's
        if (spelt := _token_to_str(s.encode("utf-8"))) != s:  # byte alphabet ("\n" as "Ċ"): a miss is a new id
            raise ValueError(f"special token {s!r} is not printable ASCII without spaces, so transformers would miss "
                             f"it in vocab.json (spelt {spelt!r} there) and give it another id than "
                             f"{tok.encode(s)[0]}; export a tokenizer without it")
    return tok


# ----------------------------------------------------------------------------
# 4. export_hf: every file whole, none replaced before all are written, nothing else in the directory touched

EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)
# Files transformers reads beside an export's, which it does not write: a stale one would load with the new model.
READ_BESIDE = ("special_tokens_map.json", "added_tokens.json")


def export_dir_problem(out_dir, overwrite):
    """Why out_dir cannot take an export, as a sentence, or "". Its other files (a hub clone's .git,
    README.md) stay; an earlier export's files (it has model.safetensors) are replaced only on
    overwrite, a run's or anything else's never."""
    def first(names):
        return next((n for n in names if os.path.lexists(os.path.join(out_dir, n))), None)
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):  # a file, a device, a broken symlink
        return f"{out_dir} exists and is not a directory; pick a directory"
    where = {os.path.dirname(os.path.realpath(os.path.join(out_dir, n))) for n in EXPORT_FILES}  # through symlinks
    if os.path.isdir(out_dir) and not all(map(writable, where)):  # a read-only mount, another user's directory
        return f"cannot write the export's files in {out_dir} (read-only, or not yours); pick a directory you can write"
    if (mine := first((*EXPORT_FILES, *RUN_MARKERS))) and not first(["model.safetensors"]):
        return (f"{out_dir} holds {mine} but no model.safetensors, so it is not an earlier export and none of "
                "its files is replaced; pick another directory")
    if stale := first(READ_BESIDE):
        return (f"{out_dir} holds {stale}, which transformers would load in place of what the export writes (its "
                "tokenizer or token ids); move it away or pick another directory")
    if mine and not overwrite:
        return f"{out_dir} holds an earlier export; pass --overwrite to replace its files (the others stay)"
    paths = [os.path.join(out_dir, n) for n in EXPORT_FILES]
    if why := next((f"{p}{w}" for p in paths if (w := unwritable(p, folders=False))), ""):  # read-only: kept
        return f"{why} where the export writes a file; move it away or pick another directory"
    return ""


def export_hf(out_dir, state_dict, model_kwargs, tokenizer=None, overwrite=False):
    """Write config.json, model.safetensors and a bpe.Tokenizer's files (EXPORT_FILES) into out_dir
    for transformers, through a symlink, beside its other files (export_dir_problem). Each is written
    in full before any replaces the earlier export's. model_kwargs are TransformerLM's. ValueError."""
    a = {**{k: p.default for k, p in inspect.signature(TransformerLM).parameters.items()}, **model_kwargs}
    bad = [name for name in NOT_LLAMA if a[name]]
    if bad:
        raise ValueError(f"a Llama cannot express the {bad[0]} ablation ({NOT_LLAMA[bad[0]]}, train.py "
                         f"--{bad[0].replace('_', '-')}), so this run cannot be exported")
    meta = TransformerLM(**model_kwargs, device="meta")  # shapes only: no memory, no time
    checked = {"model": state_dict, "iteration": 0}
    check_state(checked, meta, name="the state dict")
    state_dict = checked["model"]  # keys saved from inside torch.compile or DDP, without their prefixes
    if tokenizer is not None:
        tokenizer = fitting_tokenizer(tokenizer, a["vocab_size"])
    out_dir = os.path.abspath(out_dir)
    names = [n for n in EXPORT_FILES if tokenizer is not None or n not in TOKENIZER_FILES]
    if problem := export_dir_problem(out_dir, overwrite):
        raise ValueError(problem)
    with contextlib.ExitStack() as made:  # a full disk, Ctrl-C: the earlier export stays whole, folders made go
        try:
            made.enter_context(new_folders(out_dir))
        except OSError as e:  # read-only, a file on the way, /proc; a full disk stays the caller's (exit 1)
            if disk_is_full(e):
                raise
            raise ValueError(f"cannot create {out_dir} ({e.strerror}); pick a directory you can write") from None
        made.enter_context(dir_lock(out_dir))  # a second export here at once: refused (Busy), not renamed over this one
        if problem := export_dir_problem(out_dir, overwrite):  # again, locked: one that ended since is an earlier export
            raise ValueError(problem)
        with atomic_files([os.path.join(out_dir, n) for n in names]) as tmp:
            path = dict(zip(names, tmp))
            eot_id = (save_tokenizer(tokenizer, [path[n] for n in TOKENIZER_FILES], a["context_length"])
                      if tokenizer is not None else None)
            write_json(llama_config(a, eot_id), path["config.json"])
            write_json(generation_config(eot_id, tokenizer, a["vocab_size"], a["context_length"]),
                       path["generation_config.json"])
            save_safetensors(llama_weights(state_dict, a["num_layers"], a["num_heads"], a["tie_embeddings"]),
                             path["model.safetensors"])
    for name in set(EXPORT_FILES) - set(names):  # an earlier export's tokenizer does not fit this model
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, name))
    return out_dir


def export_run(run_dir, out_dir, overwrite, named=("--export: ", "the --out-dir and --run-name")):
    """train.py --export DIR: the run's checkpoint and tokenizer through export_hf (config.model_kwargs: the saved
    config's TransformerLM arguments, each of the type the flag's default has); a missing or damaged run, an
    ablation or an existing DIR: UsageError. named: how the messages name DIR and the run."""
    flag, run = named
    if not out_dir:  # an unset shell variable, most likely: not the current directory
        raise UsageError(f"{flag}the directory name is empty; pass the directory to write.")
    run_dir, out_dir = Path(run_dir), Path(out_dir)  # a str too: the line after the export read run_dir / "ckpt.pt"
    try:
        state = read_run(run_dir, model_kwargs())  # what train.load_run reads
        try:
            tok = read_tokenizer(run_dir, text=on_text(state["config"]))[0]
        except ValueError as e:  # one of its two files missing, or damaged
            raise ValueError(f"{e}; restore the run's vocab.json and merges.txt from a copy") from None
        out = export_hf(out_dir, state["model"], model_kwargs(state["config"]), tok, overwrite)
    except FileNotFoundError as e:  # read_run's: no checkpoint
        raise UsageError(f"{flag}{e}; pass {run} of a trained run.") from None
    except (ValueError, PermissionError) as e:  # a full disk is the caller's (exit 1)
        raise UsageError(f"{flag}{str(e).rstrip('.')}.") from None  # model.py's sentences end in a period
    step, steps = state["iteration"], state["config"].get("max_iters")  # a run stopped midway says so
    gone = diverged_step(run_dir / "metrics.jsonl")  # stopped on a NaN: it never finishes (step 0: untrained)
    why = "the run is not finished" if gone is None else f"the run diverged at step {gone:,}: its last good checkpoint"
    try:
        log(f"exported {run_dir / 'ckpt.pt'} to {out}{'' if tok else ' (no tokenizer in the run: the model only)'}; "
            + (f"step {step:,} of {steps:,} ({why}); " if type(steps) is int and step < steps else "")
            + "load it with transformers.AutoModelForCausalLM.from_pretrained"
            + ("" if importlib.util.find_spec("transformers") else " (pip install transformers)"))
    except OSError as e:  # stdout on a full disk: the export stands, and running it again would be refused
        if not disk_is_full(e):
            raise
        raise DataError(f"{out} is exported, but the disk is full: could not write {e.filename} to say so.") from None
    return 0


# ----------------------------------------------------------------------------
# 5. The command line: train.py --export's work for a run named by its directory

def main(argv=None):
    """python export.py RUN_DIR OUT_DIR [--overwrite]. Exit code: 0 done, 2 a mistake, 1 a full disk, 130 stopped:
    cli.exit_code turns each into one sentence, without a traceback."""
    def go():
        ap = Parser(prog="export.py", description="Write a training run as a Hugging Face Llama directory (what "
                    "train.py --export DIR does): config.json, model.safetensors and the tokenizer's files.")
        ap.add_argument("run_dir", metavar="RUN_DIR", type=cli.user_path, help="the run's directory, with its ckpt.pt "
                        "(train.py's --out-dir/--run-name, e.g. out/python)")
        ap.add_argument("out_dir", metavar="OUT_DIR", type=cli.user_path, help="the directory to write (made if "
                        "missing; its other files stay)")
        ap.add_argument("--overwrite", action="store_true", help="replace the files of an earlier export in OUT_DIR")
        args = ap.parse_args(argv)
        with disk_full(args.out_dir, "run the same command again"):
            return export_run(args.run_dir, args.out_dir, args.overwrite, ("", "the directory"))
    return exit_code("export.py", go, "no file was left half-written (an earlier export stays as it was): run the "
                     "same command again.")


if __name__ == "__main__":
    catch_ctrl_c()  # Ctrl-C, SIGTERM, SIGHUP: KeyboardInterrupt, then one line (exit_code)
    cli.exit_quietly(main())
