#!/usr/bin/env python3
"""The anchor scripts/gpu-check.sh measures lockstep against on a GPU, with that machine's own
python3 and PyTorch (nothing is installed): cuBLAS SGEMM through torch.matmul in fp32 with TF32
off, at 4096³ and 8192³, naming the kernel that ran (from the profiler, so that a TF32 kernel
cannot pass for SGEMM), and a PyTorch fp32 training step of a config (bench-8x512 by default:
the model of bench/torch_reference.py, the same shapes as lockstep's, on the GPU, TF32 off).

Prints one JSON object. Without torch, or without a CUDA device in torch, it prints
{"skipped": "<why>"} and exits 0: the anchor is then absent, never invented.
"""

import argparse
import importlib.util
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def skipped(why):
    print(json.dumps({"skipped": why}))
    sys.exit(0)


def kernels_of(torch, call):
    """The CUDA kernels `call` launched, by name, from the profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
    return [n for n in names if "memset" not in n.lower() and "memcpy" not in n.lower()]


def time_matmul(torch, n, repeats):
    a = torch.randn(n, n, device="cuda", dtype=torch.float32)
    b = torch.randn(n, n, device="cuda", dtype=torch.float32)
    torch.matmul(a, b)  # warm-up: cuBLAS picks its kernel
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    kernels = kernels_of(torch, lambda: torch.matmul(a, b))
    # A TF32 kernel is named so by cuBLAS (tf32, or an xmma/cutlass "tf32" tile); an SGEMM is not.
    tf32 = any("tf32" in k.lower() for k in kernels)
    return {"n": n, "seconds": round(best, 6), "tflops": round(2 * n**3 / best * 1e-12, 3),
            "kernels": kernels, "tf32_kernel": tf32}


def time_step(torch, config, steps):
    spec = importlib.util.spec_from_file_location("torch_reference",
                                                  REPO / "bench" / "torch_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    cfg = ref.load_config(config)
    m, t = cfg["model"], cfg["train"]
    seq, batch, microbatches = m["seq_len"], t["microbatch"], t["microbatches"]
    tokens_per_step = microbatches * batch * seq
    Model, rope_tables, attention_masks = ref.build(torch, m)
    torch.manual_seed(t["seed"])
    model = Model().cuda()
    params = model.ordered_parameters()
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p, decays in params if decays], "weight_decay": t["weight_decay"]},
         {"params": [p for _, p, decays in params if not decays], "weight_decay": 0.0}],
        lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    cos, sin = (z.cuda() for z in rope_tables(seq))
    masks = {w: mask.cuda() for w, mask in attention_masks(seq).items()}
    data = torch.tensor(ref.lcg_tokens(microbatches * batch * (seq + 1), m["vocab"],
                                       t["data_seed"]),
                        dtype=torch.long).cuda().view(microbatches, batch, seq + 1)
    all_params = [p for _, p, _ in params]

    def step(number):
        for group in optimizer.param_groups:
            group["lr"] = ref.learning_rate(t, number)
        optimizer.zero_grad(set_to_none=True)
        for mb in range(microbatches):
            (model(data[mb], cos, sin, masks) / tokens_per_step).backward()
        if t["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(all_params, t["clip_norm"])
        optimizer.step()

    step(1)  # warm-up
    torch.cuda.synchronize()
    seconds = []
    for number in range(2, steps + 2):
        start = time.perf_counter()
        step(number)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return {"config": cfg["name"], "tokens_per_step": tokens_per_step,
            "step_seconds": round(min(seconds), 6), "steps_timed": steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="bench-8x512", help="the training step's config")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after a warm-up")
    parser.add_argument("--sizes", default="4096,8192", help="matmul sizes, comma-separated")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        skipped(f"{sys.executable} cannot import torch")
    if not torch.cuda.is_available():
        skipped(f"torch {torch.__version__} sees no CUDA device")
    # fp32 as lockstep computes it: no TF32 in matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
              "matmul": [time_matmul(torch, int(n), 5) for n in args.sizes.split(",")],
              "step": time_step(torch, args.config, args.steps)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
