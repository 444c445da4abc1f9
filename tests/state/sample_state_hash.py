#!/usr/bin/env python3
"""Prints the state hash of tests/state/state_fixtures.h's SampleState, computed by
tools/state_hash.py's state_hash() (Python's standard library only), for the value
StateHash.PinnedValueOfTheSampleState pins. usage: tests/state/sample_state_hash.py"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import state_hash  # noqa: E402


def f32(x):
    """x rounded to binary32 (a product of two binary32 values is exact in a double)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def arrays(count, seed):
    param, m, v, grad = [], [], [], []
    for i in range(count):
        x = f32(f32(f32(i + 1) * f32(0.37)) * seed)
        param.append(f32(x - 1.5))
        m.append(f32(x * f32(1e-3)))
        v.append(f32(f32(x * x) * f32(1e-6)))
        grad.append(f32(-x * 0.125))
    return param, m, v, grad


def raw(values):
    return b"".join(struct.pack("<f", x) for x in values)


embed = arrays(12, 1)
embed[0][5] = -0.0
norm = arrays(3, 2)
norm_grad = raw(norm[3][:2]) + struct.pack("<I", 3) + b""  # a subnormal, as the fixture sets
tensors = [("embed.weight", [4, 3], embed), ("final_norm.gain", [3], norm)]
model = [(name, shape, raw(a[0])) for name, shape, a in tensors]
optimizer = []
for name, _, a in tensors:
    optimizer += [(name + ".exp_avg", None, raw(a[1])), (name + ".exp_avg_sq", None, raw(a[2]))]
grads = [("embed.weight", None, raw(embed[3])), ("final_norm.gain", None, norm_grad)]
meta = {
    "step": 7, "optimizer_step": 6,
    "lr_bits": struct.pack(">f", 3e-4).hex(), "grad_norm_bits": struct.pack(">f", 1.25).hex(),
    "clip_factor_bits": struct.pack(">f", 0.8).hex(), "skipped": False,
    "rng_seed": 1234, "rng_counter": 99, "data_cursor": 56,
    "spike": {"total_skips": 1, "recent_skips": [3]},
    "prev_hash": "ab" * 32, "tokens_digest": bytes(range(32)).hex(),
    "descriptor": '{"config":"tiny","contract":1,"note":"caf\u00e9"}',
}
meta["grad_digests"] = [state_hash.array_digest(data).hex() for _, _, data in grads]
print(state_hash.state_hash(meta, model, optimizer, grads)[0].hex())
