"""What each knob does to training: the handout's section 7 experiments, one command each.

Each experiment is a set of ordinary train.py runs, one folder each under out/experiments/<experiment>/, drawn
side by side and answered in out/experiments/report.md, where every number is read from the runs' own files.

    python experiments.py lr                # the learning-rate sweep, up to rates that diverge
    python experiments.py batch             # batch sizes at one token budget
    python experiments.py ablations         # no RMSNorm, post-norm, NoPE, a SiLU FFN, against the baseline
    python experiments.py generate          # text from the sweep's best model, greedy and sampled
    python experiments.py tokenizer         # compression (bytes/token), on another domain too, throughput
    python experiments.py optimizers        # SGD, momentum, RMSProp, Adam, AdamW and Muon raced (not in `all`)
    python experiments.py all --jobs 2      # all of them, two runs at a time on the CPU's cores
    python experiments.py all --data tinystories   # the handout's shape and budget, one run per GPU
    python experiments.py lr --variants lr=1e-02,lr=3e-02 --eval-iters 20   # train.py's flags after the name

The scale follows --data: the built-in corpus (and any local file) gets a CPU preset, train.py's small model for
400 steps, so that `all` ends within an hour on 2 cores; tinystories and owt get the handout's run (train.py's
preset) with --compile. Any flag experiments.py does not know goes to every train.py run (a variant's own flags,
such as the sweep's --lr, win; a --total-tokens budget sets the steps). A finished run is reused however its flags
were spelled (its config and data are compared, as --resume compares them); a stopped one is resumed; one that
train.py stopped on a NaN or infinite loss is a result, "diverged at step N". One line on stderr shows the runs
done, the running run's step and an ETA; a run's output is in its <variant>.log. Ctrl-C stops the running runs at a
step boundary (each saves a checkpoint): the same command goes on from there.

1. The questions of the handout's section 7, and the experiments' runs
2. One run: train.py in a process of its own, its outcome kept in result.json
3. Many runs at once: one per GPU, or --jobs on the CPU's cores
4. What a run measured: its metrics.jsonl, read back
5. Figures, the answers computed from the numbers, and the report
6. main()
"""
import argparse
import datetime
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cli  # the standard library only: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("experiments.py")
import accounting
import config
import data
import figures
import files
import machine
import rundir
import tokenizer_experiments
import train

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------------------
# 1. The questions of the handout's section 7, and the experiments' runs

QUESTIONS = {  # experiment -> its questions: the handout's (section 7; 2.7: tokenizer), optimizers' the lecture's
    "lr": ["learning_rate (a): sweep the learning rate; report the final losses (or divergence).",
           "learning_rate (b): how does the rate where training diverges relate to the best rate?"],
    "batch": ["batch_size_experiment: vary the batch size; what does it do to training?"],
    "ablations": ["layer_norm_ablation: remove RMSNorm; what happens at the previous optimal rate, and at a lower one?",
                  "pre_norm_ablation: post-norm instead of pre-norm; what happens?",
                  "no_pos_emb: no position embedding (NoPE) against RoPE?",
                  "swiglu_ablation: SwiGLU against a SiLU FFN of about the same parameter count?"],
    "generate": ["generate: text from the trained model; how fluent, and what makes it better or worse?"],
    "tokenizer": tokenizer_experiments.QUESTIONS,
    "optimizers": ["optimizers (a), the lecture's (not the handout's): its chain SGD, momentum, RMSProp, Adam, AdamW, "
                   "and Muon, each at its best rate of a sweep, one budget: which reaches the lowest validation loss?",
                   "optimizers (b): in what share of the steps, and of the seconds, does Muon reach AdamW's final "
                   "validation loss?", "optimizers (c): what does each link of the chain buy?"],
}
EXPERIMENTS = (*QUESTIONS, "all")

# The sweeps end at 100: there lr x weight decay (0.1) is 10, so each step's decay multiplies every weight by -9
# and the run overflows within a few dozen steps; the rates below it show where training stops learning.
SCALES = {  # --data -> the flags of every run, the sweeps; the model and the baseline rate are train.py's preset
    "cpu": dict(flags=["--max-iters", "400", "--eval-interval", "50"],  # 400 steps of train.py's small model
                lrs=[1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0, 10.0, 100.0], batch_sizes=[8, 32, 128]),
    "gpu": dict(flags=["--compile"],  # the handout's run: 327.68M tokens
                lrs=[3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0, 100.0], batch_sizes=[16, 64, 128, 256, 512]),
}
SAMPLING = [("greedy", 0.0, 1.0), ("temperature 0.7, top-p 0.9", 0.7, 0.9), ("temperature 1.0", 1.0, 1.0)]
SAMPLE_TOKENS = 256  # the handout's "at least 256 tokens"


class Run:
    """One train.py run: out/experiments/<experiment>/<name>/, made with the scale's flags plus its own."""

    def __init__(self, experiment, name, flags):
        self.experiment, self.name, self.flags = experiment, name, list(flags)
        self.cached, self.log_from = None, 0  # (its flags, their config): resolved()'s, once; start()'s log offset

    def dir(self, out):
        return Path(out) / "experiments" / self.experiment / self.name


def scale_of(data_source):
    return "gpu" if data_source in data.DATASETS else "cpu"


def number_text(x):  # the shortest of 1e-03, 1.2e-03, 1.25e-03, ... that reads back as x: each value a name of its own
    return next(text for digits in range(17) if float(text := f"{x:.{digits}e}") == x)  # 17 digits always read back


def lr_name(lr):  # a variant's rate in its name (a folder's): --lr 0.0012 is lr=1.2e-03, never the sweep's lr=1e-03
    return f"lr={number_text(lr)}"


def lr_flags(cfg, lr):  # --lr as it is, a --min-lr in the baseline's proportion (lr / 10 unless --min-lr is given)
    share = cfg["min_lr"] / cfg["lr"] if cfg["lr"] else config.MIN_LR_SHARE  # a baseline of --lr 0: the default
    return ["--lr", repr(lr), "--min-lr", repr(config.rounded(lr * share))]  # exactly


def plan(cfg):
    """experiment -> [(value, label, Run)]. cfg: the baseline's resolved config (train.py's preset, the scale's and
    the user's flags). The baseline is one run, the lr sweep's at its rate, which the others compare against."""
    scale, lr, b = SCALES[scale_of(cfg["data"])], cfg["lr"], cfg["batch_size"]
    sweep = {x: Run("lr", lr_name(x), lr_flags(cfg, x)) for x in sorted({*scale["lrs"], lr})}  # sweep[lr]: the baseline

    def batch_run(size):  # the baseline's tokens in all, between evaluations, in each one, and in its warm-up
        scaled = {k: max(int(k != "warmup_iters"), round(cfg[k] * b / size))  # an evaluation's seconds and noise
                  for k in ("max_iters", "eval_interval", "eval_iters", "warmup_iters")}
        return Run("batch", f"batch={size}", ["--batch-size", str(size), *(a for k, n in scaled.items() for a in (
            config.FLAG_ROWS[k][0], str(n)))])
    low = config.rounded(lr / 10)  # no RMSNorm at a 10x lower rate too: it may diverge at the baseline's
    ablations = {"baseline": sweep[lr], "no-norm": Run("ablations", "no-norm", ["--no-norm"]),
                 f"no-norm_{lr_name(low)}": Run("ablations", f"no-norm_{lr_name(low)}", ["--no-norm", *lr_flags(cfg, low)]),
                 "post-norm": Run("ablations", "post-norm", ["--post-norm"]), "nope": Run("ablations", "nope", ["--nope"]),
                 "silu-ffn": Run("ablations", "silu-ffn", ["--silu-ffn", "--d-ff", str(silu_d_ff(cfg))])}
    return {"lr": [(x, run.name, run) for x, run in sweep.items()],
            "batch": [(x, f"batch={x}", sweep[lr] if x == b else batch_run(x)) for x in sorted({*scale["batch_sizes"], b})],
            "ablations": [(name, name, run) for name, run in ablations.items()], "optimizers": race_plan(cfg)}


RACE_RATES = (1 / 3, 1, 3, 9)  # the optimizers race: each --optimizer at these times its default rate (OPTIMIZERS)


def race_plan(cfg):
    """[((optimizer, lr), label, Run)]: every --optimizer at RACE_RATES times its default rate, the baseline's other
    flags, and evaluations twice as often as the scale's (where a curve crosses a loss is read between them)."""
    every = str(max(1, cfg["eval_interval"] // 2))
    rates = [(name, float(f"{cfg['lr'] * factor * x:.2g}")) for name, factor in config.OPTIMIZERS.items()
             for x in RACE_RATES]
    return [((name, lr), f"{name}_{lr_name(lr)}", Run("optimizers", f"{name}_{lr_name(lr)}", [
        "--optimizer", name, *lr_flags(cfg, lr), "--eval-interval", every])) for name, lr in rates]


def baseline_run(plans):  # the run every experiment compares against: the lr sweep's at the baseline's rate
    return next(run for name, _, run in plans["ablations"] if name == "baseline")


def experiments_of(experiment):  # the experiments whose runs a command needs (generate: the lr sweep's)
    return {"all": ("lr", "batch", "ablations"), "generate": ("lr",), "tokenizer": ()}.get(experiment, (experiment,))


# ----------------------------------------------------------------------------
# 2. One run: train.py in a process of its own, its outcome kept in result.json

RUN_LENGTH = {"max_iters", "total_tokens"}  # one budget, in steps or in tokens: a later one replaces the other


def train_flags(*parts):
    """train.py's flags from parts given in order (the scale's, the user's, a variant's), each flag once: a later
    part's value replaces an earlier one's, and a run length in tokens (--total-tokens) one in steps, or the other
    way round (the user's token budget sets the steps that the scale would have set)."""
    values = {}
    for part in parts:
        got = config.given_flags(part)
        if RUN_LENGTH & got.keys():
            values = {k: v for k, v in values.items() if k not in RUN_LENGTH}
        values.update(got)
    flags = []
    for key, value in values.items():  # str() of a float reads back as that float; a value -x would read as a flag
        name, kind = config.FLAG_ROWS[key][:2]
        flags += ([name if value else f"--no-{name[2:]}"] if kind is bool else  # a switch: on, or --no-fast
                  [f"{name}={value}"] if str(value).startswith("-") else [name, str(value)])
    return flags


def base_flags(args, rest):  # every run's flags but its own: the data, the scale's and the user's
    return train_flags(["--data", args.data, *SCALES[scale_of(args.data)]["flags"]], rest)


def command(run, args, rest):
    """train.py's command line: the data, the scale's flags, the user's, then the variant's own, each flag once."""
    return [sys.executable, str(HERE / "train.py"), *train_flags(base_flags(args, rest), run.flags, [
        "--out-dir", str(run.dir(args.out_dir).parent), "--run-name", run.name])]


def resolved(run, args, rest):
    """The run's config as train.py resolves it (with --benchmark: its folder and data are not checked here), once
    per Run; a mistake is UsageError, named for the run."""
    flags = [*command(run, args, rest)[2:], "--benchmark"]
    if run.cached is None or run.cached[0] != flags:
        try:
            run.cached = flags, config.resolve_config(flags)
        except cli.UsageError as e:
            raise cli.UsageError(f"{run.experiment}/{run.name}: {e}") from None
    return run.cached[1]


def is_result(r):  # finish's result.json: {"status": "done", "step": None} or "diverged" at an int step; a command
    return (isinstance(r, dict) and "step" in r and isinstance(r.get("command"), list)
            and all(isinstance(a, str) for a in r["command"])
            and (r.get("status"), type(r["step"])) in (("done", type(None)), ("diverged", int)))


# What makes a run this one, for the report: what --resume compares (the model, the trajectory), where and how its
# validation loss was measured, and the device's kind (a GPU draws other initial weights, and multiplies in TF32). Not
# how the flags were typed (./t.txt, /home/me/t.txt, any order), nor what only makes it faster (--compile, --grad-accum).
SAME_RUN_KEYS = (*config.MODEL_KEYS, *rundir.TRAJECTORY_KEYS, "eval_interval", "eval_iters", "device")


def differences(saved, run, args, rest):
    """What makes the run that saved config.json `saved` another run than this command's, as --resume sees it
    (rundir.differs): the SAME_RUN_KEYS that differ, and its data (the fingerprint of its token files and
    tokenizer, against args.data_fingerprint), where a path's spelling, or a device's index, is no difference."""
    fingerprint, now = saved.get("data_fingerprint"), resolved(run, args, rest)  # an older run: a flag's default
    saved, cfg = ({**config.FLAG_DEFAULTS, **c, "device": str(c.get("device")).split(":")[0]} for c in (saved, now))
    diff = [f"{k} {cli.short_repr(saved.get(k))} -> {cli.short_repr(cfg[k])}" for k in SAME_RUN_KEYS
            if rundir.differs(k, saved.get(k), cfg[k], set(config.CORPORA), fingerprint is not None)]
    if fingerprint is not None and fingerprint != args.data_fingerprint:
        diff.append(f"its data: other token files or tokenizer than --data {args.data}'s")
    return diff


def outcome(run, args, rest):
    """The run's result.json ({"status": "done" or "diverged", "step", "command"}), or None while it has none. A run
    that is not this command's (differences, from its config.json) is refused, a stopped one too: its numbers would be
    read as ours, or train.py would resume it with this command's flags (a longer --max-iters: another schedule)."""
    folder = run.dir(args.out_dir)
    if done := (path := folder / "result.json").is_file():
        try:
            result = files.load_json(path.read_text(encoding="utf-8"), path)
            if not is_result(result):  # edited, or not finish's
                raise ValueError(f"not a result of experiments.py: {cli.short_repr(result)}")
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise cli.UsageError(f"{path} cannot be read ({e}); delete it and rerun to run that run again.") from None
    if (saved := rundir.run_config(folder)) is None and done:  # deleted, or edited: no run config to compare
        raise cli.UsageError(f"{folder / 'config.json'} holds no run config; delete {folder} to run it again.")
    if saved is not None and (diff := differences(saved, run, args, rest)):
        raise cli.UsageError(f"{folder} is a {'' if done else 'stopped '}run of other flags ({'; '.join(diff)}); "
                             "delete it, or pass another --out-dir.")
    return result if done else None


def log_path(run, args):  # all of a run's output, beside its folder (a new run's folder must be empty)
    return run.dir(args.out_dir).with_name(run.name + ".log")


def start(run, args, rest, env):
    """train.py, resumed where the run has a checkpoint, in a session of its own: a Ctrl-C in the terminal reaches
    only experiments.py, which passes on one SIGTERM (a second one would abort the run's checkpoint)."""
    ckpt = run.dir(args.out_dir) / "ckpt.pt"
    log_path(run, args).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path(run, args), "a") as log_file:
        run.log_from = log_file.tell()  # finish reads what this train.py said, not what the run's earlier ones did
        return subprocess.Popen(command(run, args, rest) + (["--resume"] if ckpt.exists() else []), stdout=log_file,
                                stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
                                preexec_fn=machine.die_with_parent if sys.platform == "linux" else None)  # it saves


def finish(run, args, rest, code):
    """A run's exit code as its result.json (done, or diverged at a step), or its fault: train.py's sentence (exit 2 a
    usage mistake, else 1), or the signal that killed it (the out-of-memory killer). 130: stopped, no result yet."""
    step = rundir.diverged_step(run.dir(args.out_dir) / "metrics.jsonl") if code == 1 else None
    if code not in (0, 130) and step is None:
        said = log_path(run, args).read_bytes()[run.log_from:].decode(errors="replace").splitlines()
        last = next((line.strip() for line in reversed(said) if line.strip()), "")  # train.py's sentence and advice
        # train.py's advice names its own command and --resume, which this one refuses: said as this command's
        last = re.sub(r"the same command( without --compile)?(,? plus --resume)?", r"this experiments.py command\1",
                      last.replace(train.GO_ON, "rerun this experiments.py command").replace(" and --resume)", ")"))
        if code < 0:  # a signal: train.py said nothing of it, and its last line only says where it stood
            last = f"signal {-code} ({signal.strsignal(-code)}: out of memory? a kill?) stopped it; the same " \
                   f"command resumes it" + (f". Its last line: {last}" if last else "")
        raise (cli.UsageError if code == 2 else cli.DataError)(
            f"the run {run.dir(args.out_dir)} failed: {last or f'exit code {code}'} (all of its output: {log_path(run, args)})")
    if code != 130:
        result = {"status": "diverged" if step else "done", "step": step, "command": command(run, args, rest)[2:]}
        files.write_json(result, run.dir(args.out_dir) / "result.json")
        cli.say(f"{run.experiment}/{run.name}: " + (f"diverged at step {step}" if step else "done"))


# ----------------------------------------------------------------------------
# 3. Many runs at once: one per GPU, or --jobs on the CPU's cores

class Progress:
    """One line for the whole experiment on stderr, as cli.show_progress shows one (a terminal redraws it, a log
    file gets one every cli.PROGRESS_EVERY seconds): the runs done, each running run's step (its metrics.jsonl) and an
    ETA, the tokens left at the speed of the tokens trained since this command started (runs of other batch sizes
    train the same tokens in other steps; a resumed run counts from its checkpoint)."""

    def __init__(self, runs, todo, args, rest):
        self.args, self.done, self.total = args, len(runs) - len(todo), len(runs)
        configs = {run: resolved(run, args, rest) for run in todo}  # each run's budget, in tokens and in steps
        self.size, self.steps = ({run: c[k] for run, c in configs.items()} for k in ("total_tokens", "max_iters"))
        self.at = {run: self.read(run) for run in todo}  # (step, tokens) as last read
        self.first = {run: tokens for run, (_, tokens) in self.at.items()}  # tokens trained before this command
        self.t0, self.shown, self.open = time.monotonic(), None, False  # open: a terminal's line is not ended yet

    def read(self, run):
        return rundir.last_step(run.dir(self.args.out_dir) / "metrics.jsonl")

    def finished(self, run):  # a diverged run trained fewer tokens than its budget: none are left of it
        self.done, self.at[run] = self.done + 1, self.read(run)
        self.size[run] = self.at[run][1]

    def show(self, running, last=False):
        self.at.update({run: self.read(run) for run in running})
        seconds = time.monotonic() - self.t0
        trained = sum(max(0, tokens - self.first[run]) for run, (_, tokens) in self.at.items())
        left = sum(max(0, self.size[run] - tokens) for run, (_, tokens) in self.at.items())
        eta = left * seconds / trained if trained else None
        text = (f"{self.done}/{self.total} runs done" + (f" in {cli.fmt_time(seconds)}" if last else
                                                         f", ETA {cli.fmt_time(eta)}")
                + "".join(f" | {run.experiment}/{run.name} step {self.at[run][0]}/{self.steps[run]}"
                          for run in running))
        self.open = sys.stderr.isatty()  # a terminal's line is redrawn whole, within its columns
        self.shown = cli.show_progress(text[:cli.COLUMNS].ljust(cli.COLUMNS) if self.open else text, self.shown, last)

    def end(self):  # what is printed next (a run's line, the report's, an error) starts a line of its own
        if self.open:
            cli.end_progress()
        self.open = False


def run_all(runs, args, rest):
    """Every run without a result (the others are reused), as many at once as there are slots, one progress line. A
    fault in one, a Ctrl-C, SIGTERM or SIGHUP stops the others (each saves a checkpoint) and ends this command."""
    todo, running = [r for r in runs if outcome(r, args, rest) is None], {}
    if len(todo) < len(runs):  # a rerun over finished runs said nothing of them
        cli.say(f"{cli.counted(len(runs) - len(todo), 'finished run')} reused")
    if not todo:
        return
    free, progress = machine.job_slots(min(args.jobs, len(todo))), Progress(runs, todo, args, rest)  # (<= runs)
    try:
        while todo or running:
            for proc in [p for p in running if p.poll() is not None]:
                run, env = running.pop(proc)
                free.append(env)
                progress.end()
                finish(run, args, rest, proc.returncode)
                if proc.returncode == 130:  # stopped by someone else: stop here too
                    raise KeyboardInterrupt
                progress.finished(run)
            while todo and free:
                run, env = todo.pop(0), free.pop()
                again = "resuming" if (run.dir(args.out_dir) / "ckpt.pt").exists() else "starting"
                progress.end()
                cli.say(f"{run.experiment}/{run.name}: {again} (log: {log_path(run, args)})")
                running[start(run, args, rest, env)] = (run, env)
            progress.show([run for run, _ in running.values()], last=not (todo or running))
            time.sleep(0.2)
    finally:
        progress.end()
        for proc in running:  # a fault or a stop: each run saves its checkpoint and ends
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            proc.wait()


# ----------------------------------------------------------------------------
# 4. What a run measured: its metrics.jsonl, read back

def number(r, key):  # a metrics record's figure: not an edited one ("x", null, true), nor a NaN or inf (a divergence)
    return type(r.get(key)) in (int, float) and math.isfinite(r[key])


def measured(run, label, args, rest):
    """A finished run's figures (None before it has finished): its validation curve (step, seconds, loss), final
    validation loss (None when it diverged), median tokens/s of its log lines, wall-clock seconds (since its first
    start, across resumes), the tokens of its budget."""
    result, path = outcome(run, args, rest), run.dir(args.out_dir) / "metrics.jsonl"
    if result is None:
        return None
    # a line cut short by a kill is no record, nor is an edited one ({"step": 3, "time": "x"})
    rows = [r for _, r in rundir.metrics_records(path) if r and number(r, "time")] if path.is_file() else []
    curve = [(r["step"], r["time"], r["val_loss"]) for r in rows if number(r, "val_loss")]
    last, tokens = (resolved(run, args, rest)[k] for k in ("max_iters", "total_tokens"))  # its budget
    if not rows or not (result["step"] or curve and curve[-1][0] == last):  # else a cut or edited last line
        raise cli.UsageError(f"{path} holds no validation loss of the run's last step ({last}); delete "
                             f"{run.dir(args.out_dir)} to run it again.")
    speeds = [r["tokens_per_s"] for r in rows if number(r, "tokens_per_s") and r["tokens_per_s"]]
    return dict(name=label, curve=curve, diverged=result["step"], wall=rows[-1]["time"], tokens=tokens,
                final=None if result["step"] else curve[-1][2], tokens_per_s=statistics.median(speeds) if speeds else 0)


def prepare(cfg):
    """The runs' data, prepared once here before any run starts (runs started together must not build the same
    token files at once) and checked (ids the baseline can count) -> its unigram baseline (data.unigram_loss),
    tokenizer (None for ids), train ids, and the fingerprint train.py saves in each run's config.json."""
    tr, va, tok, tok_files = data.prepare_data(*(cfg[k] for k in config.DATA_KEYS))  # as train.py prepares it
    config.check_samples(cfg, tok, tok_files, data.check_data(cfg, tr, va, tok), data.EOT)  # as each run would
    return data.unigram_loss(tr, va, cfg["vocab_size"]), tok, tr, data.fingerprint(tr, va, tok_files, cfg["data_dir"])


# ----------------------------------------------------------------------------
# 5. Figures (figures.py draws them), the answers computed from the numbers, and the report

SHOWS = {"lr": "the learning-rate sweep", "batch": "batch sizes at one token budget",  # a figure, in words
         "ablations": "each ablation against the baseline", "optimizers": "each optimizer at its sweep's best rate"}


def figure_title(name, cfg):  # a figure's run, data and budget, for a reader who has only the picture
    where = cfg["data"] if cfg["data"] in config.CORPORA else Path(cfg["data"]).name
    return (f"{name}: {SHOWS[name]}\n--data {where}, {cli.counted(cfg['num_layers'], 'layer')} of d_model "
            f"{cfg['d_model']}, {cli.fmt_count(cfg['total_tokens'])} tokens a run (the baseline: "
            f"{cfg['max_iters']:,} steps of {cfg['batch_size']} x {cfg['context_length']} tokens at lr "
            f"{number_text(cfg['lr'])})")


def loss_text(r):  # a run's final validation loss, or where it diverged
    return f"{r['final']:.3f}" if r["final"] is not None else f"diverged at step {r['diverged']}"


def answer_lr(rows, base, unigram):
    """rows: [(rate, figures)] of the finished runs, by rate. Unstable: a NaN or infinite loss (train.py stopped it),
    or, above the best rate, a loss no better than the unigram baseline (below it, a rate is slow, not unstable)."""
    done = [(lr, r) for lr, r in rows if r["final"] is not None]
    if not done:
        return ["(a) every rate diverged; try lower ones (a lower --lr moves the sweep's baseline)."]
    best_lr, best = min(done, key=lambda t: t[1]["final"])
    a = (f"(a) the best rate was {number_text(best_lr)} (final validation loss {best['final']:.3f}; the baseline's "
         f"{number_text(base)}); " + ", ".join(f"{number_text(lr)}: {loss_text(r)}" for lr, r in rows) + ".")
    gone = [(lr, r) for lr, r in rows if r["diverged"]]
    flat = [lr for lr, r in done if lr > best_lr and r["final"] >= unigram]
    b = (f"(b) the smallest rate that diverged was {number_text(gone[0][0])}, {gone[0][0] / best_lr:.3g}x the best "
         f"(train.py stopped it at step {gone[0][1]['diverged']})" if gone else
         f"(b) no rate up to {number_text(rows[-1][0])} diverged (a NaN or infinite loss, which train.py stops)")
    if best["final"] >= unigram:  # then every rate is "no better": the runs were too short to say which
        b += f"; no rate beat the unigram baseline ({unigram:.3f}): the runs learnt no more than token frequencies"
    elif flat:
        b += (f"; the smallest that ended no better than the unigram baseline ({unigram:.3f}) was "
              f"{number_text(flat[0])}, {flat[0] / best_lr:.3g}x the best")
    return [a, b + "."]


def answer_batch(rows):  # each run's budget in whole steps of its batch size (plan's batch_run rounds them)
    done = [(b, r) for b, r in rows if r["final"] is not None]
    if not done:
        return ["every batch size diverged."]
    best_b, best = min(done, key=lambda t: t[1]["final"])
    budget = (f"one budget of {best['tokens']:,} tokens" if len({r["tokens"] for _, r in rows}) == 1 else "budgets of "
              + ", ".join(f"{r['tokens']:,} tokens (batch {b})" for b, r in rows) + " in whole steps")
    lines = [f"at {budget}, the lowest validation loss came with batch {best_b} ({best['final']:.3f}); "
             + ", ".join(f"batch {b}: {loss_text(r)}" for b, r in rows) + "."]
    if len(timed := [(b, r) for b, r in done if r["tokens_per_s"]]) > 1:  # whole runs: a diverged one stopped early
        (b0, r0), (b1, r1) = timed[0], timed[-1]  # (before its first log line it has no speed at all)
        lines.append(f"throughput: {r0['tokens_per_s']:,.0f} tokens/s at batch {b0}, {r1['tokens_per_s']:,.0f} at "
                     f"batch {b1} ({r1['tokens_per_s'] / r0['tokens_per_s']:.2g}x); wall time {cli.fmt_time(r0['wall'])}"
                     f" against {cli.fmt_time(r1['wall'])} (the rate was not tuned again per batch size).")
    return lines


def silu_d_ff(cfg):  # a SiLU FFN's width: 2 matrices of 1.5 d_ff match SwiGLU's 3 of d_ff; near 8/3 d: handout's 4 d
    return 4 * cfg["d_model"] if abs(1.5 * cfg["d_ff"] / (4 * cfg["d_model"]) - 1) < 0.05 else round(1.5 * cfg["d_ff"])


def answer_ablations(found, cfg):
    """found: {variant name: figures}; each ablation against the baseline (the first run), as far as both ran."""
    if (base := found.get("baseline")) is None:
        return []
    ffn = {flag: accounting.lm_param_counts(cfg["vocab_size"], cfg["d_model"], cfg["num_layers"], d_ff, silu_ffn=flag)
           ["ffn"] for flag, d_ff in ((False, cfg["d_ff"]), (True, silu_d_ff(cfg)))}
    low = config.rounded(cfg["lr"] / 10)
    said = {"no-norm": f"no RMSNorm at the baseline's rate {number_text(cfg['lr'])}",
            f"no-norm_{lr_name(low)}": f"no RMSNorm at a 10x lower rate, {number_text(low)}",
            "post-norm": "post-norm", "nope": "NoPE (no position embedding)",
            "silu-ffn": f"a SiLU FFN, d_ff {silu_d_ff(cfg)} ({ffn[True]:,} FFN parameters)"}
    lines = [f"{what}: {loss_text(found[name])}" + (f" ({found[name]['final'] - base['final']:+.3f})."
                                                    if None not in (found[name]["final"], base["final"]) else ".")
             for name, what in said.items() if name in found]  # a diverged one has no loss to subtract
    return [f"the baseline (pre-norm, RoPE, SwiGLU with d_ff {cfg['d_ff']}: {ffn[False]:,} FFN parameters): "
            f"{loss_text(base)}; each ablation against it:", *lines]


def reached(curve, target, x=0):
    """The step (x=0) or second (x=1) a curve [(step, seconds, loss)] first reaches target (linear between), or None."""
    if curve[0][2] <= target:
        return curve[0][x]
    return next((a[x] + (b[x] - a[x]) * (a[2] - target) / (a[2] - b[2]) for a, b in zip(curve, curve[1:])
                 if b[2] <= target), None)


def race_best(found):
    """found: [((optimizer, lr), figures)] -> ({optimizer: (lr, figures)} of each one's lowest final loss, the
    optimizers whose best rate is at an end of their sweep)."""
    best, edges = {}, []
    for name in config.OPTIMIZERS:
        mine = [(lr, m) for (n, lr), m in found if n == name]
        if done := [(lr, m) for lr, m in mine if m["final"] is not None]:
            best[name] = min(done, key=lambda t: t[1]["final"])
            edges += [name] if len(mine) > 2 and best[name][0] in (mine[0][0], mine[-1][0]) else []
    return best, edges


def answer_optimizers(found):
    best, edges = race_best(found)
    if not best:
        return ["every run diverged."]
    lines = ["(a) " + ", ".join(f"{n} {r['final']:.3f} (lr {number_text(lr)})" for n, (lr, r) in
                                sorted(best.items(), key=lambda kv: kv[1][1]["final"]))
             + (f"; best at an end of the sweep: {', '.join(edges)} (a wider one might do better)." if edges else ".")]
    if "muon" in best and "adamw" in best:
        (_, mu), (_, ad) = best["muon"], best["adamw"]
        steps, secs = reached(mu["curve"], ad["final"]), reached(mu["curve"], ad["final"], 1)
        last, wall = ad["curve"][-1][0], ad["curve"][-1][1]
        lines.append(f"(b) Muon reached AdamW's final {ad['final']:.3f} at step {steps:.0f} of {last} "
                     f"({steps / last:.0%} of the steps) and after {secs:.0f} s of AdamW's {wall:.0f} s "
                     f"({secs / wall:.0%})." if steps is not None else
                     f"(b) Muon did not reach AdamW's final {ad['final']:.3f} in {last} steps (its own final: "
                     f"{mu['final']:.3f}).")
    chain = [n for n in ("sgd", "momentum", "rmsprop", "adam", "adamw") if n in best]
    return lines + ["(c) along the chain, final validation loss: " + " -> ".join(
        f"{n} {best[n][1]['final']:.3f}" for n in chain) + " (each link's gain is its difference to the one before)."]


def repeated(text, n=3):  # the share of a text's word n-grams that occur earlier in it (how much it loops), as text
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return f"{1 - len(set(grams)) / len(grams):.0%}" if grams else f"n/a, under {n} words"  # not 0%


def fenced(text):  # a sample as a markdown code block: control characters escaped, a fence none of its backticks close
    shown = "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
    return [fence := "`" * next(n for n in range(3, len(shown) + 4) if "`" * n not in shown), shown, fence]


def table(rows):
    lines = ["| variant | final val loss | tokens/s (median over log intervals) | wall time | diverged |",
             "|---|---|---|---|---|"]
    for r in rows:
        final = "-" if r["final"] is None else f"{r['final']:.4f}"
        gone = f"at step {r['diverged']}" if r["diverged"] else "no"
        speed = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"  # 0, 0 s: no log line before it stopped
        lines.append(f"| {r['name']} | {final} | {speed} | {cli.fmt_time(r['wall'] or None)} | {gone} |")
    return "\n".join(lines)


def slug(name):  # a setting's name as a folder name
    return "".join(c if c.isalnum() or c in ".=-" else "_" for c in name)


def sampled(path, best):  # a sample of best's checkpoint: none made since (a run made again of that name)
    ckpt = Path(best) / "ckpt.pt"  # (deleted since, to save disk: the samples are still its)
    return path.is_file() and (not ckpt.is_file() or path.stat().st_mtime >= ckpt.stat().st_mtime)


def generate(best, where, device):
    """One sample of SAMPLE_TOKENS tokens per SAMPLING setting from the best run's checkpoint (train.load_run, as
    train.py --sample), written by train.write_samples to where/<setting>/samples.txt; a sample made before is kept."""
    need = [(name, t, p) for name, t, p in SAMPLING if not sampled(where / slug(name) / "samples.txt", best)]
    if not need:
        return
    if not (Path(best) / "ckpt.pt").is_file():  # load_run's "does not exist yet": the run has finished
        raise cli.UsageError(f"{best} has finished, but its ckpt.pt, which generate samples, is gone; delete {best} "
                             "to run it again.")
    model, tok, cfg = train.load_run(best, device)
    if config.undecodable_ids(tok, model.vocab_size):  # --vocab-size above its tokenizer's, with --num-samples 0
        return cli.say(f"generate: no samples: {best}'s model draws ids its tokenizer cannot decode (its "
                       f"{model.vocab_size:,} ids, {len(tok.vocab):,} tokens); pass --vocab-size {len(tok.vocab)}.")
    for name, temperature, top_p in need:
        (where / slug(name)).mkdir(parents=True, exist_ok=True)
        train.write_samples(model, tok, dict(cfg, device=device, temperature=temperature, top_p=top_p, num_samples=1,
                                             prompt="", sample_tokens=SAMPLE_TOKENS), where / slug(name) / "samples.txt")
        cli.say(f"generate/{slug(name)}: done")


def best_run(plans, args, rest):  # the lr sweep's finished run of the lowest final loss, and its figures, or None
    done = [(run, m) for _, label, run in plans["lr"] if (m := measured(run, label, args, rest)) and m["final"]]
    return min(done, key=lambda t: t[1]["final"]) if done else None


def extra_sections(where, best, args):
    """The report's generate and tokenizer parts, from the files those experiments wrote (when they have run, on the
    best run's checkpoint and the runs' data as they are)."""
    extra, tokens = {}, where / "tokenizer" / "tokenizer.json"
    samples = best and [(name, where / "generate" / best[0].name / slug(name) / "samples.txt") for name, *_ in SAMPLING]
    if samples and all(sampled(path, best[0].dir(args.out_dir)) for _, path in samples):
        texts = [(name, path.read_text(encoding="utf-8", errors="replace").partition("\n")[2].removesuffix("\n"))
                 for name, path in samples]  # write_samples' text; one edited by hand as it is, not a traceback
        extra["generate"] = [f"From {best[0].name}, the best model of the lr sweep (final validation loss "
                             f"{best[1]['final']:.3f}); up to {SAMPLE_TOKENS} tokens each, or to the first "
                             f"{data.EOT}.", ""]
        for name, text in texts:
            extra["generate"] += [f"**{name}** (repeated word 3-grams: {repeated(text)}):", "", *fenced(text), ""]
        extra["generate"].append("- the share of repeated 3-grams by setting: " + "; ".join(
            f"{name} {repeated(text)}" for name, text in texts) + f". The model's loss "
            f"{best[1]['final']:.3f} against the unigram baseline bounds how fluent any setting can be.")
    if figures := tokenizer_experiments.stored_figures(tokens, args.data_fingerprint):
        extra["tokenizer"] = [f"- {a}" for a in tokenizer_experiments.answer_tokenizer(figures)]
    return extra


def section(name, found, cfg, baseline, where):
    """One experiment's part of the report: its questions, figure, table and answers. found: [(value, figures)].
    The optimizers' figure draws each one's best rate (the table has every run)."""
    rows = [m for _, m in found]
    drawn_rows = [dict(m, name=f"{n} (lr {number_text(lr)})") for n, (lr, m) in race_best(found)[0].items()] \
        if name == "optimizers" else rows
    drawn = figures.runs_figure(figure_title(name, cfg), drawn_rows or rows, baseline, where / f"{name}.png")
    answers = (answer_lr(found, cfg["lr"], baseline) if name == "lr" else answer_batch(found) if name == "batch"
               else answer_optimizers(found) if name == "optimizers" else answer_ablations(dict(found), cfg))
    return [f"## {name}", *(f"> {q}  " for q in QUESTIONS[name]), "", f"![{name}]({name}.png)\n" if drawn else "",
            table(rows), "", *(f"- {a}" for a in answers), ""], drawn


def reported(plans, args):
    """{experiment: its entries}, the report's sections: this command's, and each other with a result of a run of its
    own (not the shared baseline: an ablations command alone ran lr's and batch's baseline, not their experiments)."""
    def own_result(name):
        shared = {run for other, entries in plans.items() if other != name for *_, run in entries}
        return any((run.dir(args.out_dir) / "result.json").is_file() for *_, run in plans[name] if run not in shared)
    return {name: entries for name, entries in plans.items() if name in experiments_of(args.experiment) or own_result(name)}


def report(args, rest, argv, cfg, plans, baseline, extra):
    """out/experiments/report.md from every run that has finished, a section for each experiment that ran (a variant
    not run yet says its command)."""
    where, parts, drawn, base = Path(args.out_dir) / "experiments", [], True, baseline_run(plans)
    for name, entries in reported(plans, args).items():
        found = [(value, dict(m, baseline=run is base)) for value, label, run in entries
                 if (m := measured(run, label, args, rest))]
        missing = [label for _, label, run in entries if not (run.dir(args.out_dir) / "result.json").is_file()]
        lines, ok = section(name, found, cfg, baseline, where) if found else ([f"## {name}", ""], True)
        drawn &= ok
        if missing:
            again = shlex.join([name, "--data", args.data, "--out-dir", args.out_dir, *rest])  # the same runs' flags
            lines += [f"Not run yet: {', '.join(missing)} (`python experiments.py {again}`).", ""]
        parts += lines
    for name, lines in extra.items():
        parts += [f"## {name}", *(f"> {q}  " for q in QUESTIONS[name]), "", *lines, ""]
    device = train.torch.cuda.get_device_name() if cfg["device"].startswith("cuda") else cfg["device"]
    head = ["# What each knob does to training (handout section 7)", "",
            f"Written by `python experiments.py {shlex.join(argv)}` on {datetime.date.today()}: --data {cfg['data']}, "
            f"{device} ({platform.processor() or platform.machine()}, {machine.usable_cores()} cores), torch "
            f"{train.torch.__version__}. Every number is read from its run's metrics.jsonl under {where}/; the unigram "
            f"baseline is {baseline:.4f} nats/token.", ""]
    if not drawn:
        head += ["Figures: `pip install matplotlib`, then the same command again (the runs are reused).", ""]
    with files.atomic_file(where / "report.md", "w") as f:
        f.write("\n".join(head + parts))
    cli.say(f"report: {where / 'report.md'}" + ("" if drawn else "; pip install matplotlib for figures"))


# ----------------------------------------------------------------------------
# 6. main()

NOT_PASSED = {"--init-from": "starts its runs from scratch", "--sample": "samples its runs", **dict.fromkeys(
    ("--export", "--benchmark"), "trains runs (train.py exports or times one)"), **dict.fromkeys(  # experiments.py ...
    ("--run-name", "--out-dir", "--resume", "--overwrite"), "names, resumes and reuses its runs itself")}
SET_BY = {"optimizers": ("--optimizer",), "ablations": ("--no-norm", "--post-norm", "--nope", "--silu-ffn")}  # variants'

# One whole run of the CPU scale on one core, from which --help derives each experiment's time (docs/results.md)
CPU_RUN_SECONDS, MEASURED_RUN = 167, "measured: one whole run, one thread, an AMD EPYC, 2026-11-29"


def help_text():
    """--help's list: each experiment's variants (the names --variants takes), and about how long its runs take on a
    CPU, at CPU_RUN_SECONDS a run (each trains the baseline's tokens)."""
    cfg = config.resolve_config(["--data", "pydoc", *SCALES["cpu"]["flags"], "--device", "cpu", "--benchmark"])
    plans, gpu = plan(cfg), SCALES["gpu"]
    base, every = baseline_run(plans), {run for name in experiments_of("all") for *_, run in plans[name]}

    def about(n):  # n runs, one after another on one core
        return f"{n} runs, about {round(n * CPU_RUN_SECONDS / 60)} min"
    lines = textwrap.wrap(f"Experiments and their variants (the names --variants takes). On a CPU (--data python, pydoc or "
                          f"a file) a run is train.py's small model for {cfg['max_iters']} steps of {cfg['batch_size']} x "
                          f"{cfg['context_length']} tokens, about {cli.fmt_time(CPU_RUN_SECONDS)} on one core "
                          f"({MEASURED_RUN}); the times below are one core's, and 2 cores take about half as long:", 100)
    for name in ("lr", "batch", "ablations", "optimizers"):
        runs = [label + (" (baseline)" if run is base and name != "ablations" else "") for *_, label, run in plans[name]]
        lines += textwrap.wrap(f"{name:<10} {about(len(runs))}: {', '.join(runs)}", 100, initial_indent="  ",
                               subsequent_indent=" " * 13)
    lines += ["  generate   the lr sweep's runs, then samples from its best model",
              "  tokenizer  no runs: the runs' tokenizer measured (compression, another domain, speed)",
              f"  all        {about(len(every))} (the baseline once), then generate and tokenizer",
              "A finished run is reused: an experiment after another runs only the runs it does not share.",
              *textwrap.wrap(f"--data tinystories or owt: the handout's runs ("
                             f"{config.PRESETS['tinystories']['total_tokens'] / 1e6:.2f}M tokens each), a GPU's job, "
                             f"one run per GPU: rates {', '.join(number_text(x) for x in gpu['lrs'])}; batch sizes "
                             f"{', '.join(map(str, gpu['batch_sizes']))}; the same ablations.", 100)]
    return "\n".join(lines)


def parse(argv):
    p = cli.Parser(prog="experiments.py", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                   description="The handout's section 7 experiments: sets of train.py runs, their figures and\n"
                   "out/experiments/report.md. Other flags go to train.py.", epilog=help_text())
    p.add_argument("experiment", choices=EXPERIMENTS)
    p.add_argument("--data", type=cli.user_path, default="pydoc", help="as train.py's (default here: pydoc, the "
                   "documentation alone); tinystories and owt: the handout's (GPU) scale")
    p.add_argument("--out-dir", type=cli.user_path, default="out", help="OUT_DIR/experiments/<experiment>/<variant>/ "
                   "and one report.md, so its runs share --data and train.py's flags (default: out)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once on a CPU (default: 1; several GPUs: one each)")
    p.add_argument("--variants", action="append", help="names as in the report, comma-separated or repeated: only these")
    try:
        args, rest = p.parse_known_args(argv)
    except cli.UsageError as e:  # `--max-iters 20 lr`: argparse took 20 for the experiment's name
        if "invalid choice" in str(e) and (at := [i for i, a in enumerate(argv) if a in EXPERIMENTS]):
            i = at[-1]  # the last: an earlier one may be a flag's value (--tokenizer tokenizer)
            raise cli.UsageError("name the experiment before the flags: python experiments.py "
                                 + shlex.join([argv[i], *argv[:i], *argv[i + 1:]]))
        raise
    own = [o for action in p._actions for o in action.option_strings if o.startswith("--")]
    for a in (a.split("=")[0] for a in rest if a.startswith("--") and len(a) > 2):
        if mine := next((o for o in own if o.startswith(a)), None):  # --dat went to train.py as --data: other data
            raise cli.UsageError(f"{a}: experiments.py's own {mine}, spelled in full (it takes no abbreviation).")
        if flag := next((f for f in NOT_PASSED if f.startswith(a)), None):  # train.py takes --run-n for --run-name
            raise cli.UsageError(f"{a}: experiments.py {NOT_PASSED[flag]}; drop it.")
        if flag := next((f for e in experiments_of(args.experiment) for f in SET_BY.get(e, ()) if f.startswith(a)), 0):
            raise cli.UsageError(f"{a}: {args.experiment} sets each run's {flag} itself; drop it.")  # or every run had it
    if args.jobs < 1:
        raise cli.UsageError(f"--jobs {args.jobs}: pass 1 or more.")
    if not args.out_dir:  # '' would be the current folder, unasked
        raise cli.UsageError("--out-dir is empty; pass a folder (. for this one).")
    return args, rest


def chosen_runs(args, plans):
    """The runs the named experiment needs (generate: the lr sweep's), each once, as --variants narrows them."""
    runs, labels = {}, {}  # a run shared by experiments (the baseline) has a label in each
    for n in experiments_of(args.experiment):
        for _, label, run in plans[n]:
            runs[run.dir(args.out_dir)] = run
            labels.setdefault(run.dir(args.out_dir), set()).add(label)
    known = set().union(*labels.values())
    wanted = known if args.variants is None else set(",".join(args.variants).split(","))
    if wanted - known:  # "" (no name) and the tokenizer's (no runs) too
        raise cli.UsageError(f"--variants: no variant {sorted(wanted - known)[0]!r} in {args.experiment}; "
                                + (f"pick from {', '.join(sorted(known))}." if known else "it has no runs to pick."))
    return [run for where, run in runs.items() if labels[where] & wanted]


def check(runs, args, rest, where):
    """What would stop a run midway, refused before any starts: each run's flags as train.py checks them (one only a
    variant breaks: --warmup-iters past a large batch's few steps), a file in the way of one it writes (report, figure,
    result.json, log, sample, tokenizer.json), a stopped run whose ckpt.pt is gone (train.py advises flags we refuse)."""
    if not files.writable(where):  # a file, /dev/null: refused here, not once the data is prepared (minutes)
        raise cli.UsageError(f"--out-dir {args.out_dir}: cannot write {where}; pick a writable --out-dir.")
    for path in (where / "report.md", where / "tokenizer" / "tokenizer.json", *(where / f"{n}.png" for n in QUESTIONS),
                 *(p for run in runs for p in (run.dir(args.out_dir) / "result.json", log_path(run, args))),
                 *(where / "generate" / run.name / slug(s) / "samples.txt" for run in runs if run.experiment == "lr"
                   for s, *_ in SAMPLING)):  # samples: of the sweep's best run, not known yet
        if kind := files.not_a_file(path):
            raise cli.UsageError(f"{path} is {kind}, where experiments.py writes a file; move it or use another --out-dir.")
    cli.every_refusal(lambda run: resolved(run, args, rest), runs, "run")  # all at once, as the folders below
    if gone := [str(d) for d in (run.dir(args.out_dir) for run in runs)  # train.py would refuse each, advising flags
                if rundir.holds_run(d) and not any((d / f).exists() for f in ("ckpt.pt", "result.json"))]:
        raise cli.UsageError(f"{' and '.join(gone)} hold{'s a stopped run' if len(gone) == 1 else ' stopped runs'} whose "
                             f"ckpt.pt is gone; delete {'it' if len(gone) == 1 else 'them'} to run again.")


def main(argv=None):
    args, rest = parse(argv := sys.argv[1:] if argv is None else argv)
    cfg = config.resolve_config([*base_flags(args, rest), "--benchmark"])  # the user's budget sets the steps
    config.check_flags(cfg, config.DATA_CHECKS)  # --benchmark skipped the data's checks (prepare() tokenizes it)
    plans = plan(cfg)  # the baseline's flags checked above, as train.py checks them: a mistake stops all here
    runs, where = chosen_runs(args, plans), Path(args.out_dir) / "experiments"
    check(runs, args, rest, where)
    if args.experiment == "generate" and data.is_ids(args.data) and not data.ids_tokenizer(args.data, cfg["tokenizer"])[0]:
        raise cli.UsageError(f"generate writes text, and --data {args.data} is token ids without a tokenizer; "
                             "pass its --tokenizer DIR, or text data (pydoc, tinystories, owt, a .txt file).")
    if args.experiment == "tokenizer" and data.is_ids(args.data):  # both before prepare() writes the ids' digest
        raise cli.UsageError(f"tokenizer measures a tokenizer on its text, and --data {args.data} is token ids; "
                             "pass text data (pydoc, tinystories, owt, a .txt file).")
    with files.new_folders(where), files.dir_lock(where):  # a second one here is refused now, not by its runs' locks
        baseline, tok, ids, args.data_fingerprint = prepare(cfg)  # the runs' data, as outcome() compares it
        cli.every_refusal(lambda run: measured(run, "", args, rest), dict.fromkeys(  # what report() reads,
            run for entries in reported(plans, args).values() for *_, run in entries), "run")  # before any run starts
        if args.experiment == "all" and data.is_ids(args.data):  # said now, not found missing from the report's end
            cli.say(f"--data {args.data} is token ids: no tokenizer figures" + ("." if tok else ", and no samples "
                    "(its --tokenizer DIR would give them)."))
        cli.say(f"{cli.counted(len(runs), 'run')} under {where}; unigram baseline {baseline:.4f}")
        run_all(runs, args, rest)
        best = best_run(plans, args, rest)
        if args.experiment in ("generate", "all") and tok is not None and best:
            generate(best[0].dir(args.out_dir), where / "generate" / best[0].name, cfg["device"])
        elif args.experiment in ("generate", "all") and tok is not None:  # said, not left for the report's silence
            cli.say("generate: no samples: the lr sweep has no finished run that did not diverge (its best's).")
        if args.experiment in ("tokenizer", "all") and not data.is_ids(args.data):  # ids have no text to measure on
            tokenizer_experiments.tokenizer_figures(tok, ids, cfg, where / "tokenizer" / "tokenizer.json",
                                                    args.data_fingerprint)
        report(args, rest, argv, cfg, plans, baseline, extra_sections(where, best, args))
    return 0


if __name__ == "__main__":
    cli.catch_ctrl_c()  # Ctrl-C, SIGTERM and SIGHUP: KeyboardInterrupt, after which the runs stop at a step boundary
    cli.escaping_stdout()  # a terminal that cannot show a sample's text
    cli.exit_quietly(cli.exit_code("experiments.py", main, "run the same command to go on (finished runs are reused, "
                                   "stopped ones resume from their checkpoints)."))  # said while data is prepared too
