"""
The run directory (OUT_DIR/RUN_NAME): one writer at a time, an old run replaced only on --overwrite, the files
beside ckpt.pt, a checkpoint read and verified before --resume trusts it, and the stops that leave a valid one
(Ctrl-C at a step boundary, a NaN, a compile failure). Optional reading: a training loop's boundaries call it.

1. The run directory: one writer (its lock), an old run replaced only on --overwrite
2. Its files: config.json, the tokenizer, metrics.jsonl
3. --resume: the checkpoint (read and verified by checkpoints.py) must fit the model, config and data
4. Stops: Ctrl-C, SIGTERM or SIGHUP at a step boundary, a NaN, a compile failure
"""
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import torch

from cli import (SIGHUP, DataError, UsageError, counted, error_line, hang_up, log, on_stops, reader_gone,
                 reader_may_leave, short_repr)
from checkpoints import check_rng, check_state, read_checkpoint
from files import (Busy, append_line, atomic_file, clear_temporaries, copy_file, dir_lock, is_ids, load_json,
                   lock_holder, file_sha256, new_folders, not_a_file, same_file, same_folder, temporary, unwritable,
                   writable, write_json)
from machine import rank0_verdict


# ----------------------------------------------------------------------------
# 1. The run directory: one writer, an old run replaced only on --overwrite

RUN_MARKERS = ("ckpt.pt", "metrics.jsonl", "config.json")  # a directory holding one of these holds a run
TOKENIZER = ("vocab.json", "merges.txt")  # the run's copy of its tokenizer (bpe.tokenizer_files names the same pair)
RUN_FILES = (*RUN_MARKERS, "samples.txt", *TOKENIZER, "loss.png")  # every file a run writes


def run_dir(c):
    return Path(c["out_dir"]) / c["run_name"]


def run_config(d):  # the flags that made the run in directory d, as its config.json says (from_here), or None
    with contextlib.suppress(OSError, ValueError):  # (load_json: a key twice or a JSON nested too deep is one too)
        config = load_json((d / "config.json").read_text(encoding="utf-8"), d / "config.json")
        return from_here(config) if isinstance(config, dict) else None
    return None


PATH_KEYS = ("data", "val_data", "tokenizer", "data_dir")  # path flags a run config records as typed, and resolved


def from_here(config):
    """A saved run config with its paths (PATH_KEYS) as they are typed from this folder: each was typed in the folder
    its command ran in, so advice that names it, and a comparison with this command's, take it from "abs_paths" (the
    shorter of the path relative to here and the absolute one). As typed where it resolves to the same path from
    here, or where the config has no "abs_paths" (saved before 2026-12-01)."""
    resolved, here = config.get("abs_paths"), dict(config)
    for k in PATH_KEYS:
        typed, full = config.get(k), resolved.get(k) if isinstance(resolved, dict) else None
        if isinstance(typed, str) and isinstance(full, str) and os.path.isabs(full) and os.path.abspath(typed) != full:
            here[k] = min(os.path.relpath(full), full, key=len)
    return here


def in_use(where, pid):  # another process writes the run in where
    return Busy(where, pid, "or pick another --run-name")


def writer(d):  # the PID of another process that writes the run in directory d now (its lock), or None
    return None if (pid := lock_holder(d)) == os.getpid() else pid


def holds_run(d):  # does directory d hold a run (one of RUN_MARKERS), finished or stopped
    return any((Path(d) / f).exists() for f in RUN_MARKERS)


def run_dir_problem(c):
    """Why the run directory cannot take a training run, as a sentence, or "" (asked of a run that trains: --benchmark,
    --export and --sample write none). A directory with files but no run (none of RUN_MARKERS) may hold the user's
    files."""
    d = run_dir(c)
    has_run = holds_run(d)
    in_the_way = next((f"{d / name}{why}" for name in RUN_FILES if (why := unwritable(d / name))), "")  # (read-only)
    if not writable(d):
        return (f"--out-dir {c['out_dir']}: cannot write {c['out_dir']}/{c['run_name']}; pick a writable --out-dir "
                "or another --run-name.")
    if in_the_way:
        return f"{in_the_way} where the run writes a file; move it away (or make it writable), or pick another " \
               "--run-name."
    if has_run and (pid := writer(d)):  # another process writes it now: say so
        return str(in_use(d, pid))
    if has_run and not (c["resume"] or c["overwrite"]):
        old = (run_config(d) or {}).get("data")  # another file of the same name: x.txt and x.py both go to out/x
        other = isinstance(old, str) and old != c["data"] and not same_file(old, c["data"])  # not ./x.txt, ../x.txt
        return (f"{d} already holds a run{f' of --data {old}' if other else ''}; pass --resume to continue it, "
                "--overwrite to replace it, or another --run-name"
                + (f" (--run-name {Path(c['data']).name.replace('.', '_')}, say)" if other else "") + ".")
    if d.is_dir() and not has_run and any(not temporary(f) for f in os.listdir(d)):
        return (f"{c['out_dir']}/{c['run_name']} holds files but no run (no ckpt.pt, metrics.jsonl or config.json), so "
                "it is not a run directory and nothing in it is replaced; pick another --run-name.")
    return ""


@contextlib.contextmanager
def run_lock(cfg):
    """One writer per run directory: rank 0 holds its dir_lock until the run ends; a second writer is refused,
    touching nothing. Then it clears what a run killed mid-write left; an old run stays whole until the new run's
    first checkpoint. A stop or fault before that checkpoint (while the model is built) leaves no empty run
    directory (new_folders). Under torchrun the other processes stop with rank 0's verdict."""
    where, err = run_dir(cfg), None
    with contextlib.ExitStack() as held:
        if cfg["rank"] == 0:
            held.enter_context(new_folders(where))
            try:
                held.enter_context(dir_lock(where))
            except Busy as e:
                err = in_use(where, e.pid)
            if not err and (problem := run_dir_problem(cfg)):  # CHECKS again: a run beside it may have ended
                err = UsageError(problem)
            if not err and cfg["overwrite"] and (where / "ckpt.pt").exists():
                log(f"note: --overwrite: the run in {where} is replaced file by file from the new run's first "
                    "checkpoint")
            if not err:
                clear_temporaries(where)
        rank0_verdict(cfg, err)
        yield


def resume_command(cfg, without=()):
    """The advice that goes on from a run's checkpoint, as words: plus --resume (a command that has it: the same one),
    and without --overwrite (it would start over, and --resume refuses it) and the flags in `without`."""
    drop = [*without, *(["--overwrite"] if cfg["overwrite"] else [])]
    said = "the same command" + (f" without {' and '.join(drop)}" if drop else "")
    return said if cfg["resume"] else said + ("," if drop else "") + " plus --resume"


# ----------------------------------------------------------------------------
# 2. Its files: config.json, the tokenizer, metrics.jsonl

# metrics.jsonl, one JSON record a line, each with "step", then:
#   a log step: "tokens" (trained so far), "time" (seconds since the run began, across resumes), "loss" (the
#     training batch's, nats/token), "lr" (the rate of that step's update: 0 at step 1 of a warm-up), "grad_norm"
#     (before clipping; null with --grad-clip 0), "tokens_per_s" (since the last log step), "mfu" (a fraction of
#     the GPU's peak; null on a CPU, whose peak a run does not measure);
#   an evaluation: "tokens", "time", "val_loss" (the mean over --eval-iters batches) and "val_ppl";
#   a stop on a NaN or infinite number: "diverged" (the sentence) alone, the last line.

def metrics_records(path):
    """metrics.jsonl as (line, its record or None): None for a line that is no record, one cut short by a kill, not
    UTF-8 (its bytes decode to U+FFFD, which is no JSON), or edited (5, [1, 2], null, {"foo": 1}, {"step": "x"}).
    An OSError where it is no file: a FIFO would be read forever (an export waited for a writer that never came)."""
    if kind := not_a_file(path):
        raise OSError(f"{path} is {kind}, not a file")
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            e = load_json(line, path)
        except ValueError:
            e = None
        yield line, (e if isinstance(e, dict) and type(e.get("step")) is int else None)


def truncate_metrics(path, last_step):
    """Drop the lines after the step a resumed run restarts from (they run again), and that step's
    validation line (its checkpoint was saved before it); lines that are no record too, with a note."""
    if not path.exists():
        return
    keep, dropped = [], 0
    for line, e in metrics_records(path):
        if e is None:
            dropped += bool(line.strip())
        elif e["step"] < last_step or (e["step"] == last_step and "loss" in e):
            keep.append(line)
    if dropped:
        log(f"note: dropped {counted(dropped, 'line')} of {path}, not metrics records (cut short by a kill, or edited)")
    with atomic_file(path, "w") as f:
        f.write("".join(line + "\n" for line in keep))


def write_run_files(cfg, tok_files, start, new):
    """Beside ckpt.pt, after it (an --overwrite replaces an old run from there): the tokenizer, config.json, and
    metrics.jsonl cut back to the checkpoint's step. A resumed run copies the tokenizer again unless it is the
    checkpoint's (one killed before this copy, after an --overwrite, holds the old run's)."""
    where = run_dir(cfg)
    for f, digest in zip(tok_files or (), cfg["data_fingerprint"]["tokenizer"]):
        copy = where / f.name
        if not new and copy.is_file() and file_sha256(copy) == digest:
            continue
        if not new and file_sha256(f) != digest:  # changed while this run prepared
            raise UsageError(f"{f} changed while the run started, so {copy} cannot be made to match the checkpoint's "
                             "tokenizer; run the same command again.")
        if not new and copy.exists():
            log(f"note: --resume: {copy} is not the tokenizer the checkpoint was trained with; copying {f}")
        copy_file(f, copy)  # a full disk must not leave half a tokenizer
    write_json(cfg, where / "config.json")
    truncate_metrics(where / "metrics.jsonl", start)
    if new:  # what an old run here left that this one does not make (yet)
        for name in set(RUN_FILES) - set(RUN_MARKERS) - {f.name for f in tok_files or ()}:
            (where / name).unlink(missing_ok=True)


def final_val_loss(path, step):  # the validation loss metrics.jsonl holds for step, or None (no such line, no file)
    with contextlib.suppress(OSError):
        for _, e in reversed(list(metrics_records(path))):
            if e and e["step"] == step and type(e.get("val_loss")) is float:
                return e["val_loss"]
    return None


def diverged_step(path):  # the step where train.py stopped a run on a NaN or inf, as its metrics.jsonl says, or None
    with contextlib.suppress(OSError):
        return next((e["step"] for _, e in reversed(list(metrics_records(path))) if e and "diverged" in e), None)
    return None


def last_step(path):  # the (step, tokens) of the last record of a run's metrics.jsonl, read from its end; (0, 0): none
    if not_a_file(path):  # a FIFO: open() would wait for a writer
        return 0, 0
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))  # a record is a line of some 200 bytes
        for line in reversed(f.read().splitlines()):
            with contextlib.suppress(ValueError):  # the first line, cut by the seek, or one a kill cut short
                e = load_json(line.decode("utf-8", errors="replace"), path)
                if isinstance(e, dict) and type(e.get("step")) is int and type(e.get("tokens")) is int:
                    return e["step"], e["tokens"]
    return 0, 0


# ----------------------------------------------------------------------------
# 3. --resume: the checkpoint must fit the model, config and data

# What shapes the trajectory besides the model (its shape and ablations): --resume refuses a checkpoint that differs.
# Not --grad-accum, nor the number of processes: they change the arithmetic's order, never the data (micro_batches),
# so a resumed run may raise --grad-accum where it has less memory.
TRAJECTORY_KEYS = ("data", "val_data", "optimizer", "batch_size", "max_iters", "lr", "min_lr", "warmup_iters", "beta1",
                   "beta2", "eps", "weight_decay", "grad_clip", "dtype", "seed")


def as_kind(value, kind):  # a saved run config's int where a float goes (JSON's 10000) as that float, if one holds it
    return float(value) if type(value) is int and kind is float and abs(value) <= sys.float_info.max else value


def check_config(config, like, name):
    """ValueError unless a saved run config (a dict) holds every key of like, each value of the type like's has (this
    command's flags): what reads it then meets no missing key, and no str or tensor where a number or switch belongs.
    An int where a float goes (another program's rope_theta=10000) is that float, as config.json's is."""
    for k, v in like.items():
        if k in config:
            config[k] = as_kind(config[k], type(v))
        if k not in config or type(config[k]) is not type(v):
            got = f"holds {k} = {short_repr(config[k])}, not a {type(v).__name__}" if k in config else f"lacks {k!r}"
            raise ValueError(f"{name} {got} in its run config")


def holds_tokenizer(folder, fp):
    """Are folder's vocab.json and merges.txt those whose SHA-256s a run's data fingerprint fp records? (OSError)"""
    digests = [file_sha256(Path(folder) / name) for name in TOKENIZER]
    return isinstance(fp, dict) and fp.get("tokenizer") == digests


def holds_own_tokenizer(run, fp):  # does a run's folder hold the tokenizer of its fingerprint fp (none there: yes)?
    with contextlib.suppress(OSError):  # one deleted, or a directory in its place: copied again
        return not fp["tokenizer"] or holds_tokenizer(run, fp)
    return False


def read_run(d, like):
    """A run directory's checkpoint dict, its config checked against like (check_config). A run still training
    may be read: it replaces ckpt.pt whole (atomic_file), so this reads one checkpoint or the next, never half of
    one, and takes no lock. FileNotFoundError where there is no checkpoint (yet); ValueError where it is damaged."""
    ckpt = (d := Path(d)) / "ckpt.pt"
    if not ckpt.exists():  # a run starting (its folder empty, or a run's files), not any folder (out/, the data's)
        started = d.is_dir() and (not any(d.iterdir()) or any((d / f).exists() for f in RUN_FILES))
        raise FileNotFoundError(  # an export has a config.json, vocab.json and merges.txt too: given for its run
            f"{d} holds a Hugging Face export (model.safetensors), not a run" if (d / "model.safetensors").exists()
            else f"{ckpt} does not exist yet (its run has saved no checkpoint)" if started
            else f"{d} is a file, not a run directory (the run is {d.parent})" if d.is_file()
            else f"there is no run in {d}")
    state = read_checkpoint(ckpt)
    if not isinstance(state.get("config"), dict) or not isinstance(state.get("model"), dict):
        raise ValueError(f"{ckpt} holds no run config or no model")
    check_config(state["config"], like, ckpt)
    listed = run_config(d) or {}  # its config.json: another run's ckpt.pt put beside it says another shape
    if k := next((k for k in like if k in listed and listed[k] != state["config"][k]), None):
        raise ValueError(f"{d / 'config.json'} says {k} {short_repr(listed[k])}, but {ckpt} was trained with "
                         f"{short_repr(state['config'][k])}: one is another run's, or an --overwrite stopped between "
                         "them (the command that trained ckpt.pt, with --resume, writes config.json again)")
    fp, kept = state["config"].get("data_fingerprint"), [d / name for name in TOKENIZER]
    if isinstance(fp, dict) and fp.get("tokenizer") and all(f.is_file() for f in kept) \
            and not holds_tokenizer(d, fp):  # an --overwrite
        raise ValueError(f"the tokenizer in {d} (vocab.json, merges.txt) is not the one {ckpt} was trained with: "
                         "changed since, or an --overwrite stopped before writing it (the command that trained it, "
                         "with --resume, copies it again)")
    return state


def saved_config(d):
    """The run config of the run in directory d: its config.json's (run_config), else (deleted, or cut short) the
    one its ckpt.pt holds, saved from the same flags with the weights; None where neither can be read."""
    if (config := run_config(Path(d))) is None:  # (from_here already)
        with contextlib.suppress(OSError, ValueError):  # what reads the run then refuses it in its own words
            config = read_checkpoint(Path(d) / "ckpt.pt").get("config")
        config = from_here(config) if isinstance(config, dict) else None
    return config


def differs(key, old, new, names, fingerprinted):
    """Does a saved config's value old of key differ from this run's new? A value of another type does (a tensor,
    "5"). Two spellings of one --data or --val-data file (x.txt, ./x.txt, ../x.txt from a subfolder) do not: when the
    checkpoint holds the data's fingerprint, check_same_data compares the files themselves, wherever the run started.
    names: --data's corpus names, which are no paths (tinystories and owt differ at once, before any download)."""
    if type(old) is type(new) and old == new:
        return False
    paths = key in ("data", "val_data") and isinstance(old, str) and isinstance(new, str)
    return not (fingerprinted and paths and not (key == "data" and names.intersection((old, new))))


def given_tokenizer(config, run):
    """The --tokenizer a saved run config was given, as typed, or None: not the one a fine-tune took from its
    --init-from, nor a resumed fine-tune's own folder (run)."""
    saved = config.get("tokenizer")
    named = isinstance(saved, str) and saved and not same_folder(saved, run)
    return saved if named and not same_folder(saved, config.get("init_from")) else None


def on_text(config):  # did the run of this saved config train on text (so it must have a tokenizer), not on ids?
    return not is_ids(str(config.get("data", "")))


def tokenizer_origin(config, run):
    """(Where a saved run config's tokenizer came from, in words for a sentence; the --tokenizer it was given, as
    typed, or None): check_same_data's and config.same_tokenizer's one answer."""
    if given := given_tokenizer(config, run):
        return f"--tokenizer {given}", given
    saved, fp = config.get("tokenizer"), config.get("data_fingerprint")
    if isinstance(saved, str) and saved:  # given by no flag: a fine-tune's (or a resumed fine-tune's own folder)
        return "its --init-from's tokenizer", None
    if on_text(config):
        return "the tokenizer BPE made of its text", None
    if isinstance(fp, dict) and fp.get("tokenizer") == []:  # ids that came without one (checkpoints before
        return "no tokenizer (its ids came without one)", None  # fingerprints cannot tell)
    return "the tokenizer beside its --data", None


def own_flags(config, keys, defaults):
    """The advice that gives back a saved run config's values of keys, as words for a sentence, or "": the flags to
    pass (a path quoted; nothing for a value no flag gives, None: a flag left out), and the switches to drop: one off
    by default (defaults: each flag's) has no --no- form, so off is the flag left out. own_flags({"vocab_size": 320,
    "tie_embeddings": False}, ["vocab_size", "tie_embeddings"], defaults) -> "pass its own (--vocab-size 320) and drop
    --tie-embeddings"."""
    give, drop = [], []
    for k in keys:
        flag, value = "--" + k.replace("_", "-"), config.get(k)
        if type(value) is bool and not value and defaults.get(k) is False:
            drop.append(flag)
        elif type(value) is bool:
            give.append(flag if value else f"--no-{k.replace('_', '-')}")
        elif type(value) in (int, float, str):
            give += [flag, shlex.quote(str(value))]
    said = [f"pass its own ({' '.join(give)})"] if give else []
    return " and ".join(said + ([f"drop {' and '.join(drop)}"] if drop else []))


def verify_resume(cfg, ckpt_path, model_keys, model, optimizer, names, defaults):
    """The saved checkpoint, or None to start from step 0; UsageError if it is damaged, does not fit model and
    optimizer (both on the meta device: dry_step steps them), or its config differs on model_keys (TransformerLM's
    shape and ablations) or TRAJECTORY_KEYS. What the command line left to the defaults (cfg["derived"]: the
    length, the warm-up, --min-lr) is set to the run's own, in cfg. names: --data's corpus names (see differs);
    defaults: the value of each key that a config saved before it existed ran with."""
    if not ckpt_path.exists():  # killed before its first checkpoint: step 0 is where it stood
        unnamed = not cfg["init_from"] and not (ckpt_path.parent / "config.json").exists()  # a fine-tune's start too?
        log(f"note: --resume found no checkpoint {ckpt_path}; starting from step 0 with "
            + (f"--init-from {cfg['init_from']}'s weights" if cfg["init_from"] else "new weights")
            + (" (nothing names an --init-from yet: a fine-tune's must be given again)" if unnamed else ""))
        return None
    try:
        state = read_checkpoint(ckpt_path)
        if not isinstance(state.get("config"), dict):
            raise ValueError(f"{ckpt_path} holds no run config (a dict), so it was not saved by train.py")
        state["config"] = from_here(state["config"])  # its paths as typed from here, for check_same_data too
        old = {**defaults, **state["config"]}
        if "max_iters" in cfg["derived"] and type(old.get("max_iters")) is int and type(old.get("total_tokens")) is int:
            cfg["max_iters"], cfg["total_tokens"] = old["max_iters"], old["total_tokens"]  # no length given: its own
        if "min_lr" in cfg["derived"] and type(old.get("min_lr")) is float:
            cfg["min_lr"] = old["min_lr"]
        longer, shorter = extends(old, cfg), type(old.get("max_iters")) is int and cfg["max_iters"] < old["max_iters"]
        # a warm-up not given follows --max-iters: the run keeps its own. One given is the user's, compared
        own_warmup = "warmup_iters" in cfg["derived"] and type(old.get("warmup_iters")) is int
        keys = [k for k in (*model_keys, *TRAJECTORY_KEYS) if k not in cfg["unread"]  # SGD's --eps: any
                and not (longer and k == "max_iters") and not ((own_warmup or shorter) and k == "warmup_iters")]
        fingerprinted = old.get("data_fingerprint") is not None  # see differs
        differ = [k for k in keys if differs(k, old.get(k), cfg[k], set(names), fingerprinted)]
        if differ:
            lost = old.get("init_from") if isinstance(old.get("init_from"), str) and not cfg["init_from"] else None
            # a --tokenizer left out changes the vocabulary first: the flag is named too
            tok = given_tokenizer(old, ckpt_path.parent) if "vocab_size" in differ and not cfg["tokenizer"] else None
            rest = [k for k in differ if not (shorter and k == "max_iters" or tok and k == "vocab_size")]  # said
            own = "" if lost else own_flags(old, rest, defaults)  # the flags that give the rest back
            raise UsageError(f"--resume: {ckpt_path} was trained with a different config; keys that differ: "
                             + ", ".join(f"{k} ({short_repr(old.get(k))} -> {short_repr(cfg[k])})" for k in differ)
                             + (f" (a run cannot be shortened: pass --max-iters {old['max_iters']} or more)."
                                if shorter else ".")
                             + (f" It began from --init-from {lost}, which its config.json no longer names: pass "
                                f"--init-from {shlex.quote(lost)}." if lost else "")
                             + (f" It was trained with --tokenizer {shlex.quote(tok)}: pass it." if tok else "")
                             + (f" {own[0].upper()}{own[1:]} to resume it, or start a new run with --overwrite." if own
                                else ""))
        check_state(state, model, optimizer, name=ckpt_path)
        check_run_entries(state, cfg["max_iters"], ckpt_path)
        dry_step(state, model, optimizer, ckpt_path)
    except (ValueError, OSError) as e:
        raise UsageError(f"--resume: {e}; restore it from a copy, or start a new run with --overwrite.") from None
    if own_warmup:  # the warm-up it had (not one derived from a new --max-iters); an extension's cosine runs to the
        cfg["warmup_iters"] = old["warmup_iters"]  # new end from where the run stands
    return state


def note_extension(state, cfg):
    """--resume with a larger --max-iters, another --eval-iters or residual stream: what that changes, said once the
    run's data is checked too (a run refused for other data is not told it would be extended)."""
    old = state["config"]
    if type(old.get("eval_iters")) is int and old["eval_iters"] != cfg["eval_iters"]:  # allowed: not the trajectory
        log(f"note: --eval-iters changes from {old['eval_iters']} to {cfg['eval_iters']}: validation losses from step "
            f"{state['iteration']:,} on average over another number of batches than those before")
    before = old.get("bf16_residual", False)  # a run saved before --bf16-residual existed: a float32 stream
    if before is not cfg["bf16_residual"] and cfg["dtype"] == "bf16":  # allowed, as a lever: the same step, rounded
        log(f"note: the residual stream changes from {'bf16' if before else 'float32'} to "
            f"{'float32' if before else 'bf16'} at step {state['iteration']:,}; pass "
            f"--{'' if before else 'no-'}bf16-residual to keep the run's")
    if extends(old, cfg):
        log(f"note: --resume extends the run from {old['max_iters']:,} to {cfg['max_iters']:,} steps: from step "
            f"{state['iteration']:,} on, its cosine schedule is recomputed for the new end (its warm-up stays "
            f"{old['warmup_iters']}), so it is no longer bitwise the run one command of {cfg['max_iters']:,} steps "
            "would make")


def extends(old, cfg):  # does --resume ask a saved run config `old` for more steps (a larger --max-iters)?
    return (type(old.get("max_iters")) is int and cfg["max_iters"] > old["max_iters"]
            and type(old.get("warmup_iters")) is int)


def verify_init(cfg, model_keys, like, model):
    """--init-from RUN_DIR: that run's checkpoint, read and checked (read_run, like: the types of TransformerLM's
    arguments), whose shape must be this run's (model_keys) and whose weights must fit it (check_state; model: this
    run's on the meta device); UsageError in one sentence otherwise. A resumed fine-tune without a checkpoint yet
    starts from it again (its config.json names it: the flag may not have been given)."""
    start = cfg["init_from"]
    who = f"--resume: {run_dir(cfg)} has no checkpoint, and its --init-from {start}" if cfg["resume"] else \
        f"--init-from {start}"
    anew = "start the run anew with --overwrite" if cfg["resume"] else None
    try:
        state = read_run(start, like)
    except (FileNotFoundError, ValueError, OSError) as e:  # no run there, or one damaged (a ValueError)
        fix = "restore it from a copy, or start from another run" if isinstance(e, ValueError) else \
            "pass the folder of a trained run"
        raise UsageError(f"{who}: {str(e).rstrip('.')}; {anew or fix}.") from None
    if keys := [k for k in model_keys if state["config"][k] != cfg[k]]:  # flags given (a stale config.json: read_run)
        raise UsageError(f"{who}: its model has another shape; keys that differ: " + ", ".join(
            f"{k} ({short_repr(state['config'][k])} -> {short_repr(cfg[k])})" for k in keys)
            + f"; {anew or 'drop those flags to take its shape, or start from another run'}.")
    try:  # its config says this shape, but its weights are what is loaded: a damaged file is refused here, not late
        check_state(state, model, name=Path(start) / "ckpt.pt")
    except ValueError as e:
        raise UsageError(f"{who}: {e}; restore it from a copy, or {anew or 'start from another run'}.") from None
    return state


def check_run_entries(state, max_iters, name):
    """ValueError unless what train.py reads of a checkpoint besides the model and the optimizer can be used: the
    iteration within the run's max_iters steps, the RNG states (spare generators try them), the seconds trained so
    far (elapsed: a real number, at least 0 and not more than the seconds since 1970) and the data's fingerprint."""
    if state["iteration"] > max_iters:
        raise ValueError(f"{name} holds iteration {state['iteration']}, past the run's {counted(max_iters, 'step')}")
    check_rng(state.get("rng"), name)
    elapsed = state.get("elapsed", 0.0)  # checkpoints of other code have none: the clock starts at 0
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed <= time.time():
        raise ValueError(f"{name} holds elapsed {short_repr(elapsed)}, not the seconds a run has trained")
    fp = state["config"].get("data_fingerprint")  # a checkpoint from before fingerprints has none
    if fp is not None and not (isinstance(fp, dict) and fp.keys() == {"tokens", "tokenizer"} and all(
            isinstance(v, list) and all(isinstance(d, str) for d in v) for v in fp.values())):
        raise ValueError(f"{name} holds a data fingerprint {short_repr(fp)}, not lists of digests")


def dry_step(state, model, optimizer, name):
    """ValueError unless the saved optimizer state works: each saved group's settings go to the optimizer's
    constructor (which checks their ranges), then the state is loaded into optimizer and stepped once with zero
    gradients, on model's meta device (no memory, no time). What the first real step would fail on (a moment
    missing, a str step count, betas of 2) is refused before anything is read or written."""
    try:
        for group in state["optimizer"]["param_groups"]:  # a 2-D parameter: Muon's muon=True groups hold matrices only
            type(optimizer)([torch.empty(0, 0, device="meta")], **{k: v for k, v in group.items() if k != "params"})
        optimizer.load_state_dict(state["optimizer"])
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    except NotImplementedError:  # an op without a meta kernel in this torch: the real step is the only check then
        pass
    except Exception as e:  # whatever the step raises: KeyError, TypeError, ValueError, ZeroDivisionError, ...
        why = (str(e).splitlines() or [""])[0][:100]  # torch's TypeErrors go on for lines
        raise ValueError(f"{name} holds optimizer state that {type(optimizer).__name__} cannot use "
                         f"({type(e).__name__}: {why.rstrip('.')})") from None


def run_complete(state, cfg, ckpt_path, tok):
    """Is the resumed checkpoint at the run's last step, with its final evaluation in metrics.jsonl, the files
    the end of train() writes after it (samples.txt where the run samples: tok, the run's tokenizer, is not None;
    loss.png with --plot) and the tokenizer it was trained with? Then one line says so, and nothing is written again.
    Without them (stopped at the last step, during the evaluation, the sampling or the plot; a vocab.json changed
    since, which --sample refuses) the run goes on to its end, which writes them. A larger --max-iters extends it."""
    run = ckpt_path.parent
    ends = [name for name, made in (("samples.txt", tok is not None and cfg["num_samples"] > 0),
                                    ("loss.png", cfg["plot"])) if made]
    loss = final_val_loss(run / "metrics.jsonl", cfg["max_iters"])
    if state["iteration"] < cfg["max_iters"] or loss is None or not all((run / name).is_file() for name in ends) \
            or not holds_own_tokenizer(run, cfg["data_fingerprint"]):
        return False
    without = "".join(f" and without {flag}" for flag, on in (("--init-from", cfg["init_from"]),  # --sample refuses
                                                              ("--num-samples 0", not cfg["num_samples"])) if on)
    python = " with python, not torchrun," if cfg["world_size"] > 1 else ""  # --sample reads a run in one process
    log(f"{run} is already complete (step {cfg['max_iters']} of {cfg['max_iters']}, final val loss {loss:.4f}): "
        "nothing to train." + (f" For text from it, run the same command{python} with --sample instead of --resume"
                               f"{without}." if tok is not None else "") + " To train longer, resume it with a larger "
        "--max-iters.")
    return True


def check_same_data(state, cfg, ckpt_path):
    """Raises UsageError if the checkpoint was trained on other token files or another tokenizer
    (a changed text file gets a new cache and a new tokenizer: resuming on it would go on silently). Where the
    tokenizer differs because this command's flags chose another (--tokenizer given or left out), the sentence names
    the flag to pass (none for a fine-tune's, which came with its --init-from). verify_resume checked the
    fingerprint's form, and left --data's spelling to this comparison."""
    old, new = state["config"].get("data_fingerprint"), cfg["data_fingerprint"]
    was, now = (t if isinstance(t, str) and t else None for t in (state["config"].get("tokenizer"), cfg["tokenizer"]))
    flag = was != now and not same_folder(was, now)  # another --tokenizer, or one given or left out
    if isinstance(old, dict) and old.get("tokenizer") != new["tokenizer"] and flag:  # the flag, not the text
        how, given = tokenizer_origin(state["config"], ckpt_path.parent)
        fix = f"pass --tokenizer {shlex.quote(given)}" if given else "drop --tokenizer"
        raise UsageError(f"--resume: {ckpt_path} was trained with {how}, not this command's; {fix}, with the data it "
                         "was trained on, to resume it.")
    if old is not None and old != new:  # a checkpoint from before fingerprints has none: nothing to compare
        what = "tokenizer's files" if isinstance(old, dict) and old.get("tokens") == new["tokens"] else "tokens"
        raise UsageError(f"--resume: {ckpt_path} was trained on other data (its {what} differ from those of --data "
                         f"{cfg['data']} now); resume with the data it was trained on, or start a new run with "
                         "--overwrite.")


# ----------------------------------------------------------------------------
# 4. Stops: Ctrl-C at a step boundary, a NaN, a compile failure

@contextlib.contextmanager
def stop_requests(cfg):
    """Ctrl-C, SIGTERM, SIGHUP or the output's reader leaving (`| head`) stops the loop at the next step boundary,
    where model and optimizer agree, so the checkpoint saved then is valid (under DDP on GPUs: the next log step); a
    second Ctrl-C aborts at once (under torchrun, not one within a second of the first: torchrun passes on the
    signal a process got too). Yields stopped(step)."""
    asked = []  # when the first stop came
    every_step = cfg["world_size"] == 1 or cfg["device"] == "cpu"  # a CPU waits for each step anyway

    def ask(why=""):
        if not asked:
            asked.append(time.monotonic())
            when = "this step" if every_step else "the next log step (--log-interval)"  # below a terminal's
            log(f"{why}stopping after {when}; a checkpoint will be saved (Ctrl-C again to abort now)")  # progress line

    def handler(signum, frame):
        if signum == SIGHUP:  # the terminal is gone: never an abort (the kernel and the shell may both send one)
            hang_up()
        elif asked and (cfg["world_size"] == 1 or time.monotonic() - asked[0] > 1.0):
            raise KeyboardInterrupt
        ask()

    def stopped(step):  # under DDP every process must stop at the same step: one's signal stops all
        if reader_gone():  # (only rank 0 prints: its stop stops all)
            ask("the output's reader left: ")
        if cfg["world_size"] == 1:  # asking the processes is an all_reduce and a host wait: on GPUs only at log steps
            return bool(asked)  # (torchrun kills a process 30 s after a signal: a CPU's slow steps could not wait)
        if step % cfg["log_interval"] and not every_step:
            return False
        s = torch.tensor([float(bool(asked))], device=cfg["device"])
        torch.distributed.all_reduce(s)
        return bool(s.item())
    old = on_stops(handler)
    try:
        with reader_may_leave():  # the reader of the output leaving stops the loop too, as a SIGHUP does
            yield stopped
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def read_back(steps, ckpt_path):
    """steps: [(step, loss, norm)] in order, device tensors (norm None without --grad-clip), emptied here -> the last
    one's (loss, norm) as floats (None for no steps), in one host wait: until then a GPU runs ahead of Python, so a
    NaN step has been taken; stop_non_finite names the first (exit 1) and ckpt_path, saved before it, stays."""
    if not steps:
        return None
    values = torch.stack([t for _, loss, norm in steps for t in (loss, loss if norm is None else norm)]).tolist()
    for (step, _, clipped), loss, norm in zip(steps, values[::2], values[1::2]):
        norm = None if clipped is None else norm
        stop_non_finite(step, ckpt_path, loss, norm)
    steps.clear()
    return loss, norm


class Diverged(DataError):  # stop_non_finite's: the loss, the gradient norm or a weight is NaN or infinite
    def __init__(self, message, step):
        super().__init__(message)
        self.step = step


@contextlib.contextmanager
def divergence_recorded(cfg):
    """A run stopped by a NaN or an inf says so in its metrics.jsonl too, {"step": N, "diverged": the sentence}, so
    that what reads a run's outcome (a sweep of runs) reads its files, not its output. A resume drops the line."""
    try:
        yield
    except Diverged as e:
        if cfg["rank"] == 0:
            append_line(run_dir(cfg) / "metrics.jsonl", json.dumps({"step": e.step, "diverged": str(e)}))
        raise


def stop_non_finite(step, ckpt_path, loss=0.0, norm=None, model=None):
    """DataError (exit code 1; ckpt_path stays the last good one) if the loss, the gradient norm or a weight is
    NaN or infinite. Weights too: a finite loss's update can still overflow them (--lr 1e30)."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()] if model else []
    what = (f"the loss is {loss} at" if not math.isfinite(loss) else
            f"the gradient norm is {norm} at" if norm is not None and not math.isfinite(norm) else
            bad and f"the weights are not finite ({len(bad)} tensors, e.g. {bad[0]}; not saved) after")
    if what:
        raise Diverged(f"{what} step {step}: the run diverged, and its last good checkpoint {ckpt_path} stays; run "
                       "again with --overwrite and a lower --lr (or clip gradients: a lower --grad-clip, above 0).",
                       step)


@contextlib.contextmanager
def compile_failures(cfg):
    """A torch.compile failure compile_error did not foresee (one of the model's kernels, a GPU's own compiler) ends
    in one sentence, exit code 1: a run's checkpoint, saved before the model first runs, stays whole to go on from."""
    try:
        yield
    except Exception as e:
        if "torch._dynamo" not in sys.modules or not isinstance(e, torch._dynamo.exc.TorchDynamoException):
            raise  # (nothing was compiled where the compiler is not loaded: it takes a second or two to import)
        then = ("drop --compile" if cfg["benchmark"] or cfg["sample"] else  # --sample: nothing to resume
                f"the checkpoint {run_dir(cfg) / 'ckpt.pt'} is whole: go on from it with "
                f"{resume_command(cfg, ['--compile'])}")
        raise DataError(f"torch.compile failed ({error_line(e)}); {then}.") from None
