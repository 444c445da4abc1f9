#!/usr/bin/env python3
"""PyTorch reference for bench_train_step: the same model, batch and step, timed in PyTorch.

The model follows docs/model.md structure for structure: untied token embedding, optional
embedding RMSNorm, pre-norm blocks of GQA attention (optional gain-free QK-norm, rotate-half
RoPE, causal with an optional sliding window) and SwiGLU with one fused gate|up weight, a final
RMSNorm and an output head; cross-entropy plus z-loss, global-norm clipping and AdamW with
weight decay on every matrix but the embedding table, under the same warmup + cosine/WSD
learning-rate schedule. It is written the way a careful PyTorch 1.13 user would write it (no
fused attention kernel exists there: attention is explicit, with a mask; q, k and v come from one
fused projection), and reads the same YAML config.

Each worker runs as PyTorch is best run here: OPENBLAS_NUM_THREADS and OMP_NUM_THREADS equal to
torch's threads, OMP_WAIT_POLICY=PASSIVE (threads do not spin between ops, as lockstep's
pool), and OPENBLAS_CORETYPE removed from the environment, so that OpenBLAS picks its best kernel
for the CPU (this environment sets Haswell, which halves it on AVX-512); the kernel it picked is
reported (openblas_kernel).

Each thread count runs in its own subprocess, because OpenBLAS (which Debian's torch uses for
its GEMMs) reads OPENBLAS_NUM_THREADS once, when it is loaded. Every worker initialises the same
parameters from the same seed, makes one step and hashes its gradients (taken after backward,
before clipping); the parent compares the hashes across thread counts. The same step is the
warm-up; then N steps are timed.

Debian's python3-torch is installed for /usr/bin/python3 (not for other interpreters on PATH):
run this file with that interpreter.
"""

import argparse
import hashlib
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
THREAD_COUNTS = (1, 2)


# ---- config -------------------------------------------------------------------------------
def parse_scalar(text):
    """A YAML scalar as the configs use them: bool, int, float or a bare string."""
    if text in ("true", "false"):
        return text == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text.strip("\"'")


def parse_config(text, source):
    """The two-level YAML of configs/*.yaml (top-level scalars and maps of scalars).

    PyYAML is not assumed to be installed; the configs use nothing beyond this subset, and
    anything else is refused rather than guessed at.
    """
    config, current = {}, None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        key, sep, value = line.strip().partition(":")
        if not sep:
            raise ValueError(f"{source}:{number}: expected 'key: value', got {raw!r}")
        value = value.strip()
        if not line.startswith((" ", "\t")):
            if value:
                config[key], current = parse_scalar(value), None
            else:
                current = config.setdefault(key, {})
        elif current is not None and value:
            current[key] = parse_scalar(value)
        else:
            raise ValueError(f"{source}:{number}: unsupported YAML: {raw!r}")
    return config


def load_config(name_or_path):
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        path = REPO / "configs" / f"{name_or_path}.yaml"
    return parse_config(path.read_text(), str(path))


def learning_rate(t, step):
    """LearningRate() of src/train/schedule.cc (in fp64: only the timing depends on it here)."""
    peak, floor = t["lr"], t["min_lr"]
    if step <= t["warmup_steps"]:
        return peak * step / t["warmup_steps"]
    span = t["steps"] - t["warmup_steps"]
    if span <= 0 or step > t["steps"]:
        return floor
    if t["schedule"] == "cosine":
        progress = (step - t["warmup_steps"]) / span
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_steps = max(1, round(t["wsd_decay_fraction"] * t["steps"]))
    decay_start = t["steps"] - decay_steps
    if step <= decay_start:
        return peak
    return floor + (peak - floor) * (t["steps"] - step) / decay_steps


def lcg_tokens(count, vocab, seed):
    """Deterministic token ids below vocab (the values do not change the cost of a step)."""
    ids, state = [], seed & 0xFFFFFFFF
    for _ in range(count):
        state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
        ids.append((state >> 8) % vocab)
    return ids


# ---- the model (needs torch: only the workers import it) ------------------------------------
def build(torch, m):
    """Returns the model class for model config m, closed over the torch module."""
    nn, F = torch.nn, torch.nn.functional
    d, hd, hq, hkv = m["d_model"], m["head_dim"], m["n_heads"], m["n_kv_heads"]
    eps = m["norm_eps"]

    def rms_norm(x, gain=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y if gain is None else y * gain

    def layer_window(layer):  # LayerWindow() in src/model/config.cc
        if m["window"] == 0 or (layer + 1) % m["full_attention_every"] == 0:
            return 0
        return 0 if layer == m["n_layers"] - 1 else m["window"]

    class Block(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.window = layer_window(layer)
            self.attn_norm = nn.Parameter(torch.ones(d))
            self.wqkv = nn.Parameter(torch.empty((hq + 2 * hkv) * hd, d))  # q | k | v rows
            self.wo = nn.Parameter(torch.empty(d, hq * hd))
            self.ffn_norm = nn.Parameter(torch.ones(d))
            self.w_gate_up = nn.Parameter(torch.empty(2 * m["ffn_hidden"], d))  # gate | up rows
            self.w_down = nn.Parameter(torch.empty(d, m["ffn_hidden"]))

        def forward(self, x, cos, sin, masks):
            b, t, _ = x.shape
            h = rms_norm(x, self.attn_norm)
            q, k, v = F.linear(h, self.wqkv).split([hq * hd, hkv * hd, hkv * hd], dim=-1)
            q, k, v = q.view(b, t, hq, hd), k.view(b, t, hkv, hd), v.view(b, t, hkv, hd)
            if m["qk_norm"]:
                q, k = rms_norm(q), rms_norm(k)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            # [b, heads, t, hd]; query head h reads kv head h // (hq / hkv), as rk's attention.
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            scores = scores.masked_fill(masks[self.window], float("-inf"))
            o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, hq * hd)
            x = x + F.linear(o, self.wo)
            gate, up = F.linear(rms_norm(x, self.ffn_norm), self.w_gate_up).chunk(2, dim=-1)
            return x + F.linear(F.silu(gate) * up, self.w_down)

    def rope(x, cos, sin):  # rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Parameter(torch.empty(m["vocab"], d))
            self.emb_norm = nn.Parameter(torch.ones(d)) if m["embedding_norm"] else None
            self.layers = nn.ModuleList(Block(l) for l in range(m["n_layers"]))
            self.final_norm = nn.Parameter(torch.ones(d))
            self.output = nn.Parameter(torch.empty(m["vocab"], d))  # untied
            std = m["init_std"]
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.trunc_normal_(p, 0.0, std, -2 * std, 2 * std)

        def ordered_parameters(self):
            """(name, parameter, decays) in docs/model.md's canonical order."""
            out = [("tok_embeddings.weight", self.tok_embeddings, False)]
            if self.emb_norm is not None:
                out.append(("emb_norm.weight", self.emb_norm, False))
            for l, blk in enumerate(self.layers):
                for name in ("attn_norm", "attn.wqkv", "attn.wo", "ffn_norm", "ffn.w_gate_up",
                             "ffn.w_down"):
                    p = getattr(blk, name.rpartition(".")[2])
                    out.append((f"layers.{l}.{name}.weight", p, p.dim() == 2))
            out += [("final_norm.weight", self.final_norm, False),
                    ("output.weight", self.output, True)]
            return out

        def forward(self, tokens, cos, sin, masks):
            """Σ over rows of cross-entropy + z_loss · lse² (the caller scales it)."""
            inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
            x = F.embedding(inputs, self.tok_embeddings)
            if self.emb_norm is not None:
                x = rms_norm(x, self.emb_norm)
            for blk in self.layers:
                x = blk(x, cos, sin, masks)
            logits = F.linear(rms_norm(x, self.final_norm), self.output).view(-1, m["vocab"])
            loss = F.cross_entropy(logits, targets, reduction="sum")
            if m["z_loss"] != 0:
                loss = loss + m["z_loss"] * torch.logsumexp(logits, -1).pow(2).sum()
            return loss

    def rope_tables(seq):  # MakeRopeTable(): inv_freq = 1 / theta^(2i / hd), in fp32
        exponent = torch.arange(0, hd, 2, dtype=torch.float32) / hd
        inv_freq = 1.0 / torch.pow(torch.tensor(m["rope_theta"], dtype=torch.float32), exponent)
        angle = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # [seq, 1, hd/2]: broadcasts over [batch, seq, heads, hd/2]
        return angle.cos()[:, None, :], angle.sin()[:, None, :]

    def attention_masks(seq):
        """True where query t may NOT see key j: j > t, or j <= t - W for a window W."""
        pos = torch.arange(seq)
        delta = pos[:, None] - pos[None, :]  # t - j
        masks = {}
        for w in {layer_window(l) for l in range(m["n_layers"])}:
            masks[w] = (delta < 0) | (delta >= w) if w > 0 else delta < 0
        return masks

    return Model, rope_tables, attention_masks


def worker(args):
    """One thread count: prints a JSON object with the timings and the gradient hash."""
    import torch  # here, after the parent set OPENBLAS_NUM_THREADS for this process

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    m, t = cfg["model"], cfg["train"]
    seq, batch, microbatches = m["seq_len"], t["microbatch"], t["microbatches"]
    tokens_per_step = microbatches * batch * seq

    Model, rope_tables, attention_masks = build(torch, m)
    torch.manual_seed(t["seed"])
    model = Model()
    params = model.ordered_parameters()
    init_digest = hashlib.sha256()
    for _, p, _ in params:
        init_digest.update(p.detach().numpy().tobytes())
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p, decays in params if decays], "weight_decay": t["weight_decay"]},
         {"params": [p for _, p, decays in params if not decays], "weight_decay": 0.0}],
        lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    cos, sin = rope_tables(seq)
    masks = attention_masks(seq)
    data = torch.tensor(lcg_tokens(microbatches * batch * (seq + 1), m["vocab"], t["data_seed"]),
                        dtype=torch.long).view(microbatches, batch, seq + 1)
    all_params = [p for _, p, _ in params]

    def step(number, grad_digest=None):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(t, number)
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in range(microbatches):  # gradients of Σ rows / tokens, as lockstep's grad_scale
            loss = model(data[mb], cos, sin, masks) / tokens_per_step
            loss.backward()
            loss_sum += loss.item()
        if grad_digest is not None:
            for p in all_params:
                grad_digest.update(p.grad.numpy().tobytes())
        if t["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(all_params, t["clip_norm"])
        optimizer.step()
        return loss_sum

    grad_digest = hashlib.sha256()
    first_loss = step(1, grad_digest)  # also the warm-up
    seconds = []
    for number in range(2, args.steps + 2):
        start = time.perf_counter()
        step(number)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({
        "threads": args.threads, "torch_threads": torch.get_num_threads(),
        "tokens_per_step": tokens_per_step, "parameters": sum(p.numel() for p in all_params),
        "seconds": seconds, "first_step_loss": first_loss,
        "init_sha256": init_digest.hexdigest(), "grad_sha256": grad_digest.hexdigest(),
        "torch_version": torch.__version__, "openblas_kernel": openblas_kernel()}))


def openblas_kernel():
    """The OpenBLAS core in use (the library torch loaded: dlopen returns the same one)."""
    import ctypes
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "unknown"


def run_worker(args, threads):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OMP_WAIT_POLICY="PASSIVE")
    env.pop("OPENBLAS_CORETYPE", None)
    cmd = [sys.executable, __file__, "--worker", "--threads", str(threads), "--config",
           args.config, "--steps", str(args.steps)]
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="bench-8x512", help="config name or YAML path")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.worker:
        return worker(args)

    try:
        subprocess.run([sys.executable, "-c", "import torch"], check=True,
                       stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        sys.exit(f"torch_reference.py: {sys.executable} cannot import torch (Debian's "
                 "python3-torch is installed for /usr/bin/python3)")
    name = load_config(args.config)["name"]
    results = [run_worker(args, n) for n in THREAD_COUNTS]
    if len({r["init_sha256"] for r in results}) != 1:
        sys.exit("torch_reference.py: the initial parameters differ between thread counts; "
                 "the gradient comparison would be meaningless")
    same = len({r["grad_sha256"] for r in results}) == 1
    rows = []
    for r in results:
        best = min(r["seconds"])
        rows.append({
            "config": name, "threads": r["threads"], "tokens_per_step": r["tokens_per_step"],
            "seconds_per_step": round(best, 4),
            "median_seconds_per_step": round(statistics.median(r["seconds"]), 4),
            "tokens_per_second": round(r["tokens_per_step"] / best, 1),
            "bitwise_same_across_threads": same, "torch_version": r["torch_version"],
            "openblas_kernel": r["openblas_kernel"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    r0 = results[0]
    print(f"{name} in PyTorch {r0['torch_version']}: {r0['parameters'] / 1e6:.2f}M parameters, "
          f"{r0['tokens_per_step']} tokens per step; first-step loss {r0['first_step_loss']:.4f}")
    print(f"one warm-up step, then best and median of {args.steps} steps; OpenBLAS kernel "
          f"{r0['openblas_kernel']}")
    print(f"{'thr':>3} {'best s/step':>12} {'median s/st':>12} {'tokens/s':>10}")
    for row in rows:
        print(f"{row['threads']:>3} {row['seconds_per_step']:>12.3f} "
              f"{row['median_seconds_per_step']:>12.3f} {row['tokens_per_second']:>10.0f}")
    print("gradients after one step from the same init, 1 vs 2 threads: "
          + ("bitwise identical" if same else "DIFFERENT"))


if __name__ == "__main__":
    main()
