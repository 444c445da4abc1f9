#!/usr/bin/env python3
"""Writes a byte-level BPE tokenizer.json (the Hugging Face tokenizers format) learned from text
files, for lockstep's tokenizer test: independent of lockstep's reader.

usage: make_bpe_tokenizer.py STYLE MERGES OUT.json FILE...
STYLE gpt2:   the ByteLevel pre-tokenizer with its regex (GPT-2's tokenizer.json layout)
STYLE llama3: a Sequence of an Isolated Split by Llama-3's regex and ByteLevel without regex,
              with ignore_merges (Llama-3's layout)
The merges are learned by plain BPE on whitespace-separated words (the pre-tokenizer used for
encoding need not be the learner's: any valid merge list makes a valid tokenizer).
"""
import collections
import json
import sys

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's table: printable bytes stand for themselves, the rest for 256, 257, ..."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def learn(words, merges_wanted):
    table = bytes_to_unicode()
    counts = collections.Counter(tuple(table[b] for b in w.encode("utf-8")) for w in words)
    merges = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for word, n in counts.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for word, n in counts.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        counts = merged
    return table, merges


def main():
    style, merges_wanted, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    words = []
    for path in sys.argv[4:]:
        with open(path, encoding="utf-8") as f:
            for token in f.read().split():
                words.append(" " + token)  # GPT-2 style words carry their leading space
    table, merges = learn(words, merges_wanted)
    vocab = {table[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    eot = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": style == "gpt2"}
    if style == "gpt2":
        pre = byte_level
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False}, byte_level]}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": style == "llama3",
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
