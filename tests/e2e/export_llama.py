#!/usr/bin/env python3
"""lockstep export, checked by a real client: llama.cpp through node-llama-cpp 3.21.1.

Usage: export_llama.py LOCKSTEP_BINARY SOURCE_DIR

Trains small models (tiny-sized, 20 steps on `data synth` data) for each feature llama.cpp
expresses: plain (arch llama: the interleaved-RoPE row permutation), QK-norm (qwen3), embedding
norm (folded into the table), sliding windows (mimo2); exports each to GGUF, runs the GGUF in
llama.cpp (tests/clients/llama/next_token.mjs) and compares, at every prompt position, its
next-token probabilities with softmax(lockstep forward's logits), and a 32-token greedy
continuation with lockstep's own (lockstep forward on the growing sequence, argmax, ties to the
lowest id). The bound and why: docs/export.md. Also: a model llama.cpp cannot express (tiny:
windows with QK-norm) is refused naming the feature and the config keys, and exports to hf.

Exit 77 (ctest's skip) with "skipped: <why>" when node >= 20 or the client is missing.
"""
import json
import math
import os
import pathlib
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

PROB_TOLERANCE = 1e-5  # max |p_llama.cpp - p_lockstep| over all positions and ids (docs/export.md)
N_GREEDY = 32
PROMPT_LEN = 24

lockstep, source = sys.argv[1], pathlib.Path(sys.argv[2])
client = pathlib.Path(os.environ.get("LOCKSTEP_LLAMA_CLIENT") or pathlib.Path(
    os.environ.get("LOCKSTEP_CACHE") or pathlib.Path.home() / ".cache" / "lockstep")
                      / "node-llama-cpp-3.21.1")
script = source / "tests" / "clients" / "llama" / "next_token.mjs"


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


node = shutil.which("node")
if node is None:
    skip("node is not installed (scripts/install-deps.sh)")
major = int(subprocess.run([node, "-p", "process.versions.node.split('.')[0]"],
                           capture_output=True, text=True).stdout.strip() or 0)
if major < 20:
    skip(f"node-llama-cpp 3.21.1 needs node >= 20, this node is {major}")
for pkg in ("node-llama-cpp", "@node-llama-cpp/linux-x64"):
    meta = client / "node_modules" / pkg / "package.json"
    if not meta.is_file() or json.loads(meta.read_text())["version"] != "3.21.1":
        skip(f"{pkg}@3.21.1 is not installed in {client} (scripts/install-llama-client.sh)")


def run(*args, expect=0):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"FAIL: {' '.join(map(str, args))}: exit {r.returncode}, expected {expect}\n"
                 f"{r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def read_logits(path):
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    t = header["logits"]
    begin, end = t["data_offsets"]
    rows, vocab = t["shape"]
    flat = struct.unpack(f"<{rows * vocab}f", data[8 + n + begin:8 + n + end])
    return [list(flat[r * vocab:(r + 1) * vocab]) for r in range(rows)]


def softmax(row):
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


def lockstep_logits(ckpt, ids, work):
    tokens = work / "tokens.bin"
    tokens.write_bytes(struct.pack(f"<{len(ids) + 1}I", *ids, 0))  # a dummy last target
    run(lockstep, "forward", "--checkpoint", ckpt, "--tokens", tokens, "--out", work / "out.st")
    return read_logits(work / "out.st")


def argmax(row):
    best = 0
    for i, x in enumerate(row):
        if x > row[best]:
            best = i  # strict: ties keep the lowest id
    return best


TINY = (source / "configs" / "tiny.yaml").read_text()


def config(work, name, **model):
    text = re.sub(r"^name: tiny", f"name: {name}", TINY, flags=re.M)
    for key, value in model.items():
        text, n = re.subn(rf"^(  {key}:) [^\n]*", rf"\1 {value}", text, flags=re.M)
        assert n == 1, key
    path = work / f"{name}.yaml"
    path.write_text(text)
    return path


CASES = [  # name, model keys, llama.cpp architecture
    ("plain", dict(qk_norm="false", embedding_norm="false", window=0), "llama"),
    ("qknorm", dict(qk_norm="true", embedding_norm="false", window=0), "qwen3"),
    ("embnorm", dict(qk_norm="false", embedding_norm="true", window=0), "llama"),
    # 4 layers, every 3rd full: layers 0, 1 slide (window 8), 2 (every 3rd) and 3 (last) full.
    ("windows", dict(qk_norm="false", embedding_norm="true", window=8, n_layers=4,
                     full_attention_every=3), "mimo2"),
]

with tempfile.TemporaryDirectory(prefix="lockstep-export-") as tmp:
    work = pathlib.Path(tmp)
    data = work / "data"
    run(lockstep, "data", "synth", "--out", data, "--seed", 3, "--tokens", 40000)
    rng = random.Random(7)
    prompt = [rng.randrange(256) for _ in range(PROMPT_LEN)]
    failures = []
    for name, keys, arch in CASES:
        start = time.time()
        run_dir = work / f"run-{name}"
        run(lockstep, "train", "--config", config(work, name, **keys), "--data", data, "--out",
            run_dir, "--steps", 20)
        ckpt = run_dir / "checkpoints" / "step_000000020"
        gguf = work / f"{name}.gguf"
        out = run(lockstep, "export", "--checkpoint", ckpt, "--format", "gguf", "--out", gguf,
                  "--data", data)
        if f"gguf {arch}," not in out:
            failures.append(f"{name}: expected architecture {arch}: {out}")
        client_out = json.loads(run(node, script, client, gguf, json.dumps(prompt), N_GREEDY))
        theirs = client_out["probs"]
        ours = [softmax(r) for r in lockstep_logits(ckpt, prompt, work)]
        diff = max(abs(a - b) for ra, rb in zip(ours, theirs) for a, b in zip(ra, rb))
        if len(theirs) != len(ours) or any(len(r) != len(ours[0]) for r in theirs):
            failures.append(f"{name}: llama.cpp gave {len(theirs)} rows of "
                            f"{len(theirs[0])}; lockstep {len(ours)} of {len(ours[0])}")
        seq, greedy = list(prompt), []
        for _ in range(N_GREEDY):
            nxt = argmax(lockstep_logits(ckpt, seq, work)[-1])
            greedy.append(nxt)
            seq.append(nxt)
        agree = next((i for i, (a, b) in enumerate(zip(greedy, client_out["greedy"])) if a != b),
                     N_GREEDY)
        print(f"{name}: arch {client_out['architecture']}, max |dp| {diff:.3g} over "
              f"{len(ours)} positions x {len(ours[0])} ids, greedy agrees for {agree}/{N_GREEDY} "
              f"tokens ({time.time() - start:.1f} s)")
        if diff > PROB_TOLERANCE:
            failures.append(f"{name}: max |dp| {diff:.3g} > {PROB_TOLERANCE}")
        if agree != N_GREEDY:
            failures.append(f"{name}: greedy continuations differ at token {agree}: lockstep "
                            f"{greedy}, llama.cpp {client_out['greedy']}")

    # tiny itself: windows with QK-norm, which no llama.cpp architecture expresses.
    run_dir = work / "run-tiny"
    run(lockstep, "train", "--config", "tiny", "--data", data, "--out", run_dir, "--steps", 2)
    ckpt = run_dir / "checkpoints" / "step_000000002"
    refused = run(lockstep, "export", "--checkpoint", ckpt, "--format", "gguf", "--out",
                  work / "tiny.gguf", expect=2)
    if "model.window = 8" not in refused or "model.qk_norm = true" not in refused:
        failures.append(f"tiny gguf refusal names neither feature nor key: {refused}")
    if (work / "tiny.gguf").exists() or any(p.name.startswith(".tmp-") for p in work.iterdir()):
        failures.append("a refused export left a file behind")
    out = run(lockstep, "export", "--checkpoint", ckpt, "--format", "hf", "--out", work / "hf",
              "--data", data)
    hf = json.loads((work / "hf" / "config.json").read_text())
    if hf["architectures"] != ["Qwen3ForCausalLM"] or hf["layer_types"] != [
            "sliding_attention", "full_attention"] or hf["sliding_window"] != 8:
        failures.append(f"tiny hf config.json: {hf}")
    for f in ("model.safetensors", "generation_config.json", "tokenizer.json"):
        if not (work / "hf" / f).is_file():
            failures.append(f"tiny hf: no {f}")
    again = run(lockstep, "export", "--checkpoint", ckpt, "--format", "hf", "--out", work / "hf",
                expect=2)
    if "exists" not in again:
        failures.append(f"an export over an existing directory was not refused: {again}")
    print(f"tiny: gguf refused ({refused.strip().splitlines()[-1][:100]}...); hf Qwen3ForCausalLM")

    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures))
    print("PASS")
