"""Tests for train.py: batches, checkpoints, gradient accumulation, kill/resume, DDP, errors, downloads."""
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

_TRAIN_ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(_TRAIN_ROOT))
import train  # noqa: E402
from model import TransformerLM  # noqa: E402
from optim import AdamW, cross_entropy  # noqa: E402

# a model small enough that a step takes milliseconds on a CPU
_TRAIN_TINY = ["--vocab-size", "64", "--d-model", "32", "--num-heads", "2", "--num-layers", "2", "--d-ff", "64",
               "--context-length", "16", "--batch-size", "8", "--eval-iters", "2", "--num-samples", "0"]


def _train_toy_ids(path, n=20_000, seed=0):
    """A learnable id stream: a repeating 0..49 ramp with 10% of positions replaced by id 7."""
    rng = np.random.default_rng(seed)
    x = np.tile(np.arange(50, dtype=np.uint16), n // 50 + 1)[:n]
    x[rng.random(n) < 0.1] = 7
    np.save(path, x)
    return path


def _train_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _train_losses(run_dir):
    return [(r["step"], r["loss"]) for r in _train_metrics(run_dir) if "loss" in r]


def _train_cli(args, cwd, env=None, **kw):
    return subprocess.run([sys.executable, str(_TRAIN_ROOT / "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, **kw)


def _train_cfg(**over):
    cfg = {"device": "cpu", "dtype": "float32", "world_size": 1, "grad_clip": 0.0}
    cfg.update(over)
    return cfg


# ---------------------------------------------------------------------------- batches

def test_train_get_batch_windows_and_range(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(100, dtype=np.uint16))
    data = np.load(tmp_path / "ids.npy", mmap_mode="r")
    x, y = train.get_batch(data, 4096, 10, "cpu", generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4096, 10) and x.dtype == y.dtype == torch.int64
    # data[i] == i, so each row is start + arange and y is x shifted by one
    assert torch.equal(x, x[:, :1] + torch.arange(10)) and torch.equal(y, x + 1)
    starts = x[:, 0]
    assert int(starts.min()) == 0 and int(starts.max()) == 100 - 10 - 1  # uniform over [0, n - T)
    counts = torch.bincount(starts, minlength=90).float()
    assert counts.min() > 0.4 * counts.mean()  # every start is reachable
    a = train.get_batch(data, 8, 10, "cpu", generator=torch.Generator().manual_seed(3))[0]
    b = train.get_batch(data, 8, 10, "cpu", generator=torch.Generator().manual_seed(3))[0]
    assert torch.equal(a, b)


def test_train_unigram_baseline_matches_counter():
    rng = np.random.default_rng(1)
    tr, va = rng.integers(0, 20, 5000).astype(np.uint16), rng.integers(0, 25, 700).astype(np.uint16)
    c, n, V = Counter(tr.tolist()), len(tr), 30
    expected = -sum(np.log((c[int(t)] + 1) / (n + V)) for t in va) / len(va)
    assert train.unigram_loss(tr, va, V) == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------------------- checkpoints

def _train_model_opt(seed=0):
    torch.manual_seed(seed)
    m = TransformerLM(64, 16, 32, 2, 2, 64)
    return m, AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _train_one_step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randint(64, (4, 16), generator=g), torch.randint(64, (4, 16), generator=g)
    opt.zero_grad()
    cross_entropy(m(x), y).backward()
    opt.step()


def test_train_checkpoint_roundtrip_path_and_file_object(tmp_path):
    m, opt = _train_model_opt()
    _train_one_step(m, opt, 1)
    buf = io.BytesIO()
    train.save_checkpoint(m, opt, 7, tmp_path / "c.pt")
    train.save_checkpoint(m, opt, 7, buf)
    raw = torch.load(tmp_path / "c.pt", weights_only=True)  # plain tensors and Python values only
    assert set(raw) >= {"model", "optimizer", "iteration"} and "layers.0.attn.q_proj.weight" in raw["model"]
    for src in (tmp_path / "c.pt", str(tmp_path / "c.pt"), io.BytesIO(buf.getvalue())):
        m2, opt2 = _train_model_opt(seed=5)
        assert train.load_checkpoint(src, m2, opt2) == 7
        for k, v in m.state_dict().items():
            assert torch.equal(v, m2.state_dict()[k])
        # identical states => the next step is identical too (optimizer moments restored)
        _train_one_step(m2, opt2, 2)
        ref_m, ref_opt = _train_model_opt(seed=9)
        train.load_checkpoint(tmp_path / "c.pt", ref_m, ref_opt)
        _train_one_step(ref_m, ref_opt, 2)
        for p, q in zip(m2.parameters(), ref_m.parameters()):
            assert torch.equal(p, q)
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temporary left behind


def test_train_checkpoint_failed_save_keeps_old(tmp_path, monkeypatch):
    m, opt = _train_model_opt()
    train.save_checkpoint(m, opt, 3, tmp_path / "c.pt")
    before = (tmp_path / "c.pt").read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        train.save_checkpoint(m, opt, 4, tmp_path / "c.pt")
    assert (tmp_path / "c.pt").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]


# ---------------------------------------------------------------------------- the step

def test_train_grad_accumulation_equals_big_batch():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(64, (8, 16), generator=g), torch.randint(64, (8, 16), generator=g)
    results = []
    for accum in (1, 4):
        m, opt = _train_model_opt()
        micro = list(zip(x.chunk(accum), y.chunk(accum)))
        loss, _ = train.train_step(m, opt, micro, 1e-2, _train_cfg())
        results.append((float(loss), [p.grad.clone() for p in m.parameters()]))
    # oracle: autograd on the whole batch at once
    m, _ = _train_model_opt()
    full = cross_entropy(m(x), y)
    full.backward()
    for loss, grads in results:
        assert loss == pytest.approx(full.item(), rel=1e-6)
        for gr, p in zip(grads, m.parameters()):
            torch.testing.assert_close(gr, p.grad, rtol=1e-5, atol=1e-7)


def test_train_activation_checkpointing_same_gradients():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(64, (4, 16), generator=g), torch.randint(64, (4, 16), generator=g)
    grads = []
    for ckpt in (False, True):
        m, opt = _train_model_opt()
        if ckpt:
            train.use_activation_checkpointing(m)
        train.train_step(m, opt, [(x, y)], 1e-2, _train_cfg())
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_train_bf16_autocast_keeps_float32_master_weights():
    m, opt = _train_model_opt()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(64, (4, 16), generator=g), torch.randint(64, (4, 16), generator=g)
    loss32, _ = train.train_step(m, opt, [(x, y)], 1e-2, _train_cfg())
    m, opt = _train_model_opt()
    loss16, _ = train.train_step(m, opt, [(x, y)], 1e-2, _train_cfg(dtype="bf16"))
    opt.step()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in m.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    assert float(loss16) == pytest.approx(float(loss32), rel=2e-2)  # bf16 has ~3 significant digits


# ---------------------------------------------------------------------------- whole runs

def test_train_text_run_end_to_end(tmp_path, capsys):
    words = "the cat sat on a mat and the dog ran to the park while a bird sang in the old tree".split()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, 40)) + "." for _ in range(200)]
    (tmp_path / "story.txt").write_text("<|endoftext|>".join(docs))
    args = ["--data", str(tmp_path / "story.txt"), "--data-dir", str(tmp_path / "data"), "--out-dir",
            str(tmp_path / "out"), *_TRAIN_TINY, "--vocab-size", "300", "--max-iters", "30", "--eval-interval", "10",
            "--num-samples", "2", "--sample-tokens", "20", "--workers", "1"]
    assert train.main(args) == 0
    run = tmp_path / "out" / "story"
    assert {"vocab.json", "merges.txt", "metrics.jsonl", "ckpt.pt", "samples.txt", "config.json"} <= set(os.listdir(run))
    rows = _train_metrics(run)
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 10, 20, 30]
    assert all(k in rows[-2] for k in ("step", "tokens", "time", "loss", "lr", "tokens_per_s", "mfu"))
    out = capsys.readouterr().out
    assert "unigram baseline" in out and "final val loss" in out
    assert (run / "samples.txt").read_text().count("--- sample") == 2
    # the checkpoint restores a model built from the saved config
    cfg = json.loads((run / "config.json").read_text())
    m = TransformerLM(**train.model_kwargs(cfg))
    assert train.load_checkpoint(run / "ckpt.pt", m) == 30
    # a rerun reuses the tokenizer and token files
    cache = next((tmp_path / "data").glob("story-*/bpe300"))
    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert train.main(args[:-10] + ["--max-iters", "2", "--num-samples", "0"]) == 0
    assert stamps == {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}


def test_train_kill_and_resume_is_bitwise_identical(tmp_path):
    ids = _train_toy_ids(tmp_path / "toy.npy")
    args = ["--data", str(ids), *_TRAIN_TINY, "--max-iters", "100", "--eval-interval", "40", "--log-interval", "1",
            "--checkpoint-interval", "10", "--device", "cpu"]
    full = _train_cli([*args, "--run-name", "full"], tmp_path, timeout=300)
    assert full.returncode == 0, full.stderr
    log = open(tmp_path / "killed.log", "w")
    p = subprocess.Popen([sys.executable, str(_TRAIN_ROOT / "train.py"), *args, "--run-name", "killed"], cwd=tmp_path,
                         stdout=log, stderr=subprocess.STDOUT)
    metrics = tmp_path / "out" / "killed" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 27:  # past a checkpoint, mid-interval
            break
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    rc = p.wait()
    log.close()
    assert rc == -signal.SIGKILL, f"the run ended by itself (rc {rc}): {(tmp_path / 'killed.log').read_text()[-2000:]}"
    done_before = len(_train_losses(tmp_path / "out" / "killed"))
    assert 0 < done_before < 100
    resumed = _train_cli([*args, "--run-name", "killed", "--resume"], tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    a, b = _train_metrics(tmp_path / "out" / "full"), _train_metrics(tmp_path / "out" / "killed")
    la, lb = _train_losses(tmp_path / "out" / "full"), _train_losses(tmp_path / "out" / "killed")
    assert la == lb, [(x, y) for x, y in zip(la, lb) if x != y][:3]  # bitwise
    assert [(r["step"], r["val_loss"]) for r in a if "val_loss" in r] == \
           [(r["step"], r["val_loss"]) for r in b if "val_loss" in r]


def test_train_ctrl_c_saves_and_exits_cleanly(tmp_path):
    ids = _train_toy_ids(tmp_path / "toy.npy")
    args = ["--data", str(ids), *_TRAIN_TINY, "--max-iters", "100000", "--log-interval", "1",
            "--checkpoint-interval", "100000", "--device", "cpu"]
    p = subprocess.Popen([sys.executable, str(_TRAIN_ROOT / "train.py"), *args], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "toy" / "metrics.jsonl"
    while p.poll() is None and not (metrics.exists() and metrics.read_text().count("\n") >= 5):
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "--resume" in out
    last = _train_losses(tmp_path / "out" / "toy")[-1][0]
    assert train.read_checkpoint(tmp_path / "out" / "toy" / "ckpt.pt")["iteration"] == last


def test_train_nan_loss_stops_and_keeps_checkpoint(tmp_path, monkeypatch, capsys):
    import optim
    ids = _train_toy_ids(tmp_path / "toy.npy")
    real, calls = optim.cross_entropy, []

    def poisoned(logits, targets):  # the 13th training micro-batch (after 2 eval batches) goes NaN
        calls.append(1)
        out = real(logits, targets)
        return out * float("nan") if len(calls) == 15 else out
    monkeypatch.setattr(optim, "cross_entropy", poisoned)
    args = ["--data", str(ids), *_TRAIN_TINY, "--max-iters", "50", "--checkpoint-interval", "5",
            "--out-dir", str(tmp_path / "out")]
    assert train.main(args) == 1
    assert "loss is nan at step 13" in capsys.readouterr().err
    assert train.read_checkpoint(tmp_path / "out" / "toy" / "ckpt.pt")["iteration"] == 10


def test_train_ddp_two_processes_match_one(tmp_path):
    ids = _train_toy_ids(tmp_path / "toy.npy")
    args = ["--data", str(ids), *_TRAIN_TINY, "--max-iters", "8", "--log-interval", "1", "--device", "cpu",
            "--eval-interval", "4"]
    one = _train_cli([*args, "--run-name", "one"], tmp_path, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(_TRAIN_ROOT / "train.py"), *args, "--run-name", "two"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = _train_metrics(tmp_path / "out" / "one"), _train_metrics(tmp_path / "out" / "two")
    la, lb = [r["loss"] for r in a if "loss" in r], [r["loss"] for r in b if "loss" in r]
    assert len(la) == len(lb) == 8
    # the same global batch, split over two processes: only the summation order differs
    np.testing.assert_allclose(lb, la, rtol=1e-5)
    np.testing.assert_allclose([r["val_loss"] for r in b if "val_loss" in r],
                               [r["val_loss"] for r in a if "val_loss" in r], rtol=1e-5)
    assert json.loads((tmp_path / "out" / "two" / "config.json").read_text())["world_size"] == 2


def test_train_benchmark_prints_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main([*_TRAIN_TINY, "--benchmark", "--benchmark-steps", "2", "--data", "tinystories"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "accounting.lm_forward_flops" in out
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------- bad input

def test_train_usage_errors_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch):
    ids = _train_toy_ids(tmp_path / "toy.npy")
    np.save(tmp_path / "short.npy", np.arange(12, dtype=np.uint16))
    np.save(tmp_path / "big.npy", np.array([1, 2, 3, 900] * 100, dtype=np.uint16))
    (tmp_path / "afile").write_text("x")
    out = str(tmp_path / "out")
    base = ["--data", str(ids), *_TRAIN_TINY, "--out-dir", out]
    cases = [
        (base + ["--d-model", "30", "--num-heads", "4"], "--num-heads"),
        (base + ["--batch-size", "6", "--grad-accum", "4"], "--batch-size 6"),
        (["--data", str(tmp_path / "short.npy"), *_TRAIN_TINY, "--out-dir", out], "--context-length 16"),
        (["--data", str(tmp_path / "missing.txt"), "--out-dir", out], "no such file"),
        (["--data", str(tmp_path / "big.npy"), *_TRAIN_TINY, "--out-dir", out], "token id 900"),
        (base + ["--max-iters", "5", "--total-tokens", "1000"], "--total-tokens"),
        (base + ["--no-norm", "--post-norm"], "--post-norm"),
        (base + ["--out-dir", str(tmp_path / "afile" / "sub")], "--out-dir"),
        (base + ["--warmup-iters", "500", "--max-iters", "10"], "--warmup-iters"),
        (base + ["--lr", "-1"], "--lr"),
        (base + ["--bogus-flag"], "--bogus-flag"),
        (base + ["--dtype", "fp8"], "--dtype"),
        (base + ["--device", "tpu"], "--device tpu"),
    ]
    for argv, needle in cases:
        rc = _train_rc(argv)
        err = capsys.readouterr().err
        assert rc == 2, (argv, err)
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (needle, err)
        assert not os.path.exists(out), argv
    # the DDP case: the global batch must split over the ranks (checked before any process group starts)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train.main(base + ["--batch-size", "9"]) == 2
    assert "2 processes" in capsys.readouterr().err


def _train_rc(argv):
    """main()'s exit code, whether it returns it or argparse exits with it."""
    try:
        return train.main(argv)
    except SystemExit as e:
        return e.code


def test_train_resume_with_different_config_lists_keys(tmp_path, capsys):
    ids = _train_toy_ids(tmp_path / "toy.npy")
    base = ["--data", str(ids), *_TRAIN_TINY, "--out-dir", str(tmp_path / "out"), "--max-iters", "3"]
    assert train.main(base) == 0
    before = sorted(os.listdir(tmp_path / "out" / "toy"))
    stamp = (tmp_path / "out" / "toy" / "ckpt.pt").stat().st_mtime_ns
    capsys.readouterr()
    assert train.main(base + ["--resume", "--lr", "1e-2", "--d-ff", "96"]) == 2
    err = capsys.readouterr().err
    assert "keys that differ" in err and "lr" in err and "d_ff (64 -> 96)" in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path / "out" / "toy")) == before
    assert (tmp_path / "out" / "toy" / "ckpt.pt").stat().st_mtime_ns == stamp
    # a run killed before its first checkpoint resumes from step 0
    assert train.main(base + ["--resume", "--run-name", "fresh"]) == 0
    assert "starting from step 0" in capsys.readouterr().out
    assert train.read_checkpoint(tmp_path / "out" / "fresh" / "ckpt.pt")["iteration"] == 3


def test_train_plot_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    ids = _train_toy_ids(tmp_path / "toy.npy")
    assert train.main(["--data", str(ids), *_TRAIN_TINY, "--out-dir", str(tmp_path / "out"), "--plot"]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- downloads

class _TrainRangeHandler(http.server.BaseHTTPRequestHandler):
    payload = bytes(range(256)) * 4000
    honor_range = True
    seen = []

    def do_GET(self):
        rng = self.headers.get("Range")
        type(self).seen.append(rng)
        start = int(rng.split("=")[1].rstrip("-")) if rng and self.honor_range else 0
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def _train_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TrainRangeHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _TrainRangeHandler.seen = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    _TrainRangeHandler.honor_range = True


def test_train_download_resumes_with_range(tmp_path, _train_server):
    payload = _TrainRangeHandler.payload
    (tmp_path / "f.txt.part").write_bytes(payload[:12345])  # an interrupted earlier download
    train.download(f"{_train_server}/f.txt", tmp_path / "f.txt", progress=False)
    assert (tmp_path / "f.txt").read_bytes() == payload
    assert _TrainRangeHandler.seen == ["bytes=12345-"] and not (tmp_path / "f.txt.part").exists()
    # a server that ignores Range sends everything: the partial file is replaced, not appended to
    _TrainRangeHandler.honor_range = False
    (tmp_path / "g.txt.part").write_bytes(b"stale bytes")
    train.download(f"{_train_server}/g.txt", tmp_path / "g.txt", progress=False)
    assert (tmp_path / "g.txt").read_bytes() == payload


def test_train_offline_download_fails_with_one_sentence(tmp_path, capsys, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: connection refused, like being offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    rc = train.main(["--data", "tinystories", "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "could not download" in err and "TinyStoriesV2-GPT4-train.txt" in err and str(tmp_path / "data") in err
    assert not (tmp_path / "out").exists()


def test_train_plot_draws_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional (pip install matplotlib)")
    rows = [{"step": 0, "time": 0.0, "val_loss": 5.0}, {"step": 1, "time": 0.5, "loss": 4.0},
            {"step": 2, "time": 1.0, "loss": 3.0}, {"step": 2, "time": 1.1, "val_loss": 3.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train.plot(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_local_text_split_keeps_whole_documents(tmp_path):
    docs = [f"document {i} " * (i % 7 + 1) for i in range(100)]
    (tmp_path / "t.txt").write_text("<|endoftext|>".join(docs))
    tr, va = train.local_corpus(tmp_path / "t.txt", tmp_path / "c")
    a, b = tr.read_text(), va.read_text()
    assert a + "<|endoftext|>" + b == (tmp_path / "t.txt").read_text()  # nothing lost, nothing duplicated
    assert b.split("<|endoftext|>")[0] in docs  # the cut falls between documents
    assert 0.1 <= len(b) / (len(a) + len(b)) < 0.15
