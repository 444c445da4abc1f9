#!/usr/bin/env python3
"""An independent writer of Megatron-style indexed datasets, for lockstep's import test.

Written from the public description of the format (Megatron-LM, megatron/core/datasets/
indexed_dataset.py: "MMapIndexedDataset"), not from lockstep's reader:

  PREFIX.bin  the tokens of every sequence, one after another, as little-endian DTYPE
  PREFIX.idx  b"MMIDIDX\\x00\\x00"             9 bytes
              version                       u64 = 1
              dtype code                    u8  (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                                                 8 uint16)
              sequence count S              u64
              document count D              u64 (entries of document_indices: documents + 1)
              sequence_lengths              S x int32 (tokens)
              sequence_pointers             S x int64 (byte offset of each sequence in the .bin)
              document_indices              D x int64 (the first sequence of each document, then S)

usage: megatron_writer.py PREFIX SPEC.json
SPEC: {"dtype": "uint16", "documents": [[[tok, ...], [tok, ...]], ...]}: each document a list of
sequences, each sequence a list of token ids. Python's standard library only.
"""
import json
import struct
import sys

DTYPES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"),
          "int64": (5, "q"), "uint16": (8, "H")}


def write(prefix, dtype, documents):
    code, fmt = DTYPES[dtype]
    size = struct.calcsize("<" + fmt)
    lengths, pointers, document_indices = [], [], [0]
    with open(prefix + ".bin", "wb") as bin_file:
        offset = 0
        for document in documents:
            for sequence in document:
                bin_file.write(struct.pack(f"<{len(sequence)}{fmt}", *sequence))
                lengths.append(len(sequence))
                pointers.append(offset)
                offset += len(sequence) * size
            document_indices.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx_file:
        idx_file.write(b"MMIDIDX\x00\x00")
        idx_file.write(struct.pack("<Q", 1))
        idx_file.write(struct.pack("<B", code))
        idx_file.write(struct.pack("<Q", len(lengths)))
        idx_file.write(struct.pack("<Q", len(document_indices)))
        idx_file.write(struct.pack(f"<{len(lengths)}i", *lengths))
        idx_file.write(struct.pack(f"<{len(pointers)}q", *pointers))
        idx_file.write(struct.pack(f"<{len(document_indices)}q", *document_indices))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        spec = json.load(f)
    write(sys.argv[1], spec["dtype"], spec["documents"])
