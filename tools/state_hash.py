#!/usr/bin/env python3
"""Recompute a lockstep checkpoint's state hash from its files alone.

usage: state_hash.py CHECKPOINT_DIR [--components]

Checks every file against COMPLETE, recomputes the state hash with the byte layout of
docs/formats/state-hash.md and prints it (64 hex digits) on stdout; --components also prints
each component digest. Exit status: 0 when the hash equals meta.json's "state_hash", 1 when it
differs, 2 when the checkpoint cannot be read. Python's standard library only, so that an
auditor can check lockstep's hashes without lockstep.
"""
import hashlib
import json
import os
import struct
import sys

TAG = b"lockstep/state-hash/v2\x00"
CHUNK_BYTES = 4 << 18  # kHashChunkFloats elements of 4 bytes
TENSOR_FILE_TAG = b"lockstep/tensor-file/v1\x00"


def blake2b(data):
    return hashlib.blake2b(data, digest_size=32).digest()


def array_digest(data):
    """H(u64(element count) || H(chunk 0) || H(chunk 1) || ...), chunks of CHUNK_BYTES."""
    chunks = b"".join(blake2b(data[at:at + CHUNK_BYTES]) for at in range(0, len(data), CHUNK_BYTES))
    return blake2b(u64(len(data) // 4) + chunks)


class CheckpointError(Exception):
    pass


def tensor_file_digest(name, data):
    """COMPLETE's digest of a tensor file: H(tag || u64(data_start) || H(header bytes) ||
    A(each tensor's data, in data order)) (docs/formats/checkpoint.md)."""
    (header_size,) = struct.unpack_from("<Q", data, 0)
    start = 8 + header_size
    arrays = b"".join(array_digest(bytes(raw)) for _, _, raw in read_safetensors(name, data))
    return blake2b(TENSOR_FILE_TAG + u64(start) + blake2b(data[:start]) + arrays)


def read_listed_files(directory):
    """Returns {name: bytes} for every file COMPLETE lists, after checking size and digest."""
    with open(os.path.join(directory, "COMPLETE"), "rb") as f:
        listing = json.load(f)
    if listing.get("format_version") != 3:
        raise CheckpointError(f"{directory}: COMPLETE format_version is not 3")
    names = {"model.safetensors", "optimizer.safetensors", "meta.json"}
    if set(listing["files"]) not in (names, names | {"grads.safetensors"}):
        raise CheckpointError(f"{directory}: COMPLETE lists {sorted(listing['files'])}")
    files = {}
    for name, entry in sorted(listing["files"].items()):
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            data = f.read()
        if name.endswith(".safetensors"):
            digest = tensor_file_digest(name, data).hex() == entry["digest"]
        else:
            digest = blake2b(data).hex() == entry["blake2b"]
        if len(data) != entry["size"] or not digest:
            raise CheckpointError(f"{path}: size or digest differs from COMPLETE")
        files[name] = data
    return files


def read_safetensors(name, data):
    """Returns [(tensor name, shape, raw little-endian F32 bytes)] in file (data) order."""
    (header_size,) = struct.unpack_from("<Q", data, 0)
    raw = data[8:8 + header_size]
    header = json.loads(raw)
    # The one form docs/formats/checkpoint.md allows: compact, keys sorted, space-padded to 8.
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False).encode("utf-8")
    canonical += b" " * (-len(canonical) % 8)
    if raw != canonical or header.get("__metadata__", None) == {}:
        raise CheckpointError(f"{name}: the header is not in canonical form")
    body = memoryview(data)[8 + header_size:]
    entries = sorted((info["data_offsets"], key, info) for key, info in header.items()
                     if key != "__metadata__")
    tensors = []
    for (begin, end), key, info in entries:
        if info["dtype"] != "F32":
            raise CheckpointError(f"{name}: tensor {key}: dtype {info['dtype']} is not F32")
        tensors.append((key, info["shape"], body[begin:end]))
    return tensors


def u64(*values):
    return struct.pack(f"<{len(values)}Q", *values)


def u32(*values):
    return struct.pack(f"<{len(values)}I", *values)


def state_hash(meta, model, optimizer, grads=None):
    """Returns (hash, [(component name, digest)]) as docs/formats/state-hash.md defines them.
    The gradients' digests are meta.json's grad_digests; with `grads` (a checkpoint with full
    gradients) each gradient must hash to its listed digest."""
    spike = meta["spike"]
    scalars = (u64(meta["step"], meta["optimizer_step"]) +
               u32(int(meta["lr_bits"], 16), int(meta["grad_norm_bits"], 16),
                   int(meta["clip_factor_bits"], 16), 1 if meta["skipped"] else 0) +
               u64(meta["rng_seed"], meta["rng_counter"], meta["data_cursor"],
                   spike["total_skips"], len(spike["recent_skips"]), *spike["recent_skips"]))
    layout = u64(len(model))
    for name, shape, _ in model:
        encoded = name.encode("utf-8")
        layout += u32(len(encoded)) + encoded + u32(len(shape)) + u64(*shape)
    components = [
        ("prev_hash", bytes.fromhex(meta["prev_hash"])),
        ("scalars", blake2b(scalars)),
        ("descriptor", blake2b(meta["descriptor"].encode("utf-8"))),
        ("tokens", bytes.fromhex(meta["tokens_digest"])),
        ("layout", blake2b(layout)),
    ]
    moments = {name: data for name, _, data in optimizer}
    grad_digests = [bytes.fromhex(d) for d in meta["grad_digests"]]
    if len(grad_digests) != len(model):
        raise CheckpointError(f"meta.json: {len(grad_digests)} grad_digests for "
                              f"{len(model)} parameters")
    gradients = None if grads is None else {name: data for name, _, data in grads}
    for (name, _, param), grad in zip(model, grad_digests):
        if gradients is not None and array_digest(gradients[name]) != grad:
            raise CheckpointError(f"grads.safetensors: {name} does not hash to its grad_digests "
                                  "entry")
        components += [
            ("param:" + name, array_digest(param)),
            ("m:" + name, array_digest(moments[name + ".exp_avg"])),
            ("v:" + name, array_digest(moments[name + ".exp_avg_sq"])),
            ("grad:" + name, grad),
        ]
    return blake2b(TAG + b"".join(digest for _, digest in components)), components


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--components"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    directory = argv[1]
    try:
        files = read_listed_files(directory)
        meta = json.loads(files["meta.json"])
        tensors = {name: read_safetensors(name, files[name + ".safetensors"])
                   for name in ("model", "optimizer", "grads") if name + ".safetensors" in files}
        digest, components = state_hash(meta, tensors["model"], tensors["optimizer"],
                                        tensors.get("grads"))
    except (OSError, ValueError, KeyError, TypeError, struct.error, CheckpointError) as e:
        print(f"state_hash.py: {directory}: cannot read the checkpoint: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    print(digest.hex())
    if len(argv) == 3:
        for name, component in components:
            print(f"{component.hex()}  {name}")
    if digest.hex() != meta["state_hash"]:
        print(f"state_hash.py: {directory}: recomputed {digest.hex()}, "
              f"meta.json records {meta['state_hash']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
