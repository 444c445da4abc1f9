#!/usr/bin/env python3
"""A generation receipt checked from docs/formats/receipt.md alone, with Python's standard library.

Trains `tiny` 20 steps, generates with sampling and a receipt, then, without `generate`, checks
every request's prompt digest and rebuilds its logits chain from `lockstep forward`'s logits of
the whole sequence (prompt + output): the receipt's chain must be those logits' chain, position
by position, and each output token must be what the sampling recipe of docs/numerics.md gives
for greedy requests (the argmax, lowest id first). A signed receipt's Ed25519 signature is
checked over the canonical text the page defines (PyNaCl, Debian's python3-nacl: run it with
/usr/bin/python3).

    usage: receipt_check.py LOCKSTEP
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import nacl.signing


def blake2b(data):
    return hashlib.blake2b(data, digest_size=32).digest()


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


def read_logits(path):
    """The F32 tensor "logits" of a safetensors file: (rows, cols, flat list)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + n])
    t = header["logits"]
    assert t["dtype"] == "F32", t
    begin, end = t["data_offsets"]
    rows, cols = t["shape"]
    raw = data[8 + n + begin : 8 + n + end]
    return rows, cols, raw


def check(lockstep, receipt_path, checkpoint, work):
    whole = json.load(open(receipt_path))
    receipt = whole["receipt"]
    assert receipt["format"] == "lockstep-receipt" and receipt["kind"] == "generation"
    if "signature" in whole:
        canonical = json.dumps(receipt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        message = b"lockstep/receipt/v1\0" + blake2b(canonical.encode())
        key = nacl.signing.VerifyKey(bytes.fromhex(whole["signature"]["ed25519"]))
        key.verify(message, bytes.fromhex(whole["signature"]["signature"]))  # raises if forged
        print("signature verifies over the canonical receipt")
    greedy = receipt["sampling"]["temperature"] == "0"
    for i, req in enumerate(receipt["requests"]):
        prompt, out = req["prompt_tokens"], req["output_tokens"]
        ids = struct.pack(f"<{len(prompt)}I", *prompt)
        assert blake2b(ids).hex() == req["prompt_blake2b"], f"request {i}: prompt digest"
        seq = prompt + out
        tokens = os.path.join(work, f"tokens{i}.bin")
        with open(tokens, "wb") as f:
            f.write(struct.pack(f"<{len(seq)}I", *seq))
        logits_file = os.path.join(work, f"logits{i}.safetensors")
        run(lockstep, "forward", "--checkpoint", checkpoint, "--tokens", tokens, "--out", logits_file)
        rows, vocab, raw = read_logits(logits_file)
        assert rows == len(seq) - 1, (rows, len(seq))
        chain = bytes.fromhex(req["prompt_blake2b"])
        for k, token in enumerate(out):
            position = len(prompt) - 1 + k
            row = raw[position * vocab * 4 : (position + 1) * vocab * 4]
            chain = blake2b(chain + row)
            if chain.hex() != req["logits_chain"][k]:
                sys.exit(f"request {i}: the chain parts from lockstep forward's logits at output token {k}")
            if greedy:
                values = struct.unpack(f"<{vocab}f", row)
                best = max(range(vocab), key=lambda v: (values[v], -v))
                assert best == token, f"request {i}, output token {k}: argmax {best}, receipt {token}"
        print(f"request {i}: {len(out)} output tokens, chain = lockstep forward's logits' chain")


def main():
    lockstep = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        run(lockstep, "data", "synth", "--out", f"{work}/data", "--seed", "3", "--tokens", "200000")
        run(lockstep, "train", "--config", "tiny", "--data", f"{work}/data", "--out", f"{work}/run",
            "--steps", "20", "--no-progress")
        checkpoint = f"{work}/run/checkpoints/step_000000020"
        run(lockstep, "keygen", "--out", f"{work}/key")
        for name, sampling in [("greedy", []),
                               ("sampled", ["--temperature", "0.8", "--top-k", "40", "--seed", "9",
                                            "--sign-key", f"{work}/key"])]:
            receipt = f"{work}/{name}.json"
            run(lockstep, "generate", "--checkpoint", checkpoint, "--data", f"{work}/data",
                "--prompt", "the ", "--max-tokens", "30", "--receipt", receipt, *sampling)
            check(lockstep, receipt, checkpoint, work)
    print("receipts check out from docs/formats/receipt.md and lockstep forward")


if __name__ == "__main__":
    main()
