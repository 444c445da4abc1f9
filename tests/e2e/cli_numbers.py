#!/usr/bin/env python3
"""Every numeric option of every command refuses a value outside its range, or not a number.

The options and their ranges come from docs/cli.md (the binary's --help texts, checked current by
the cli_doc_is_current test): typed INT / UINT / FLOAT options with CLI11's range, POSITIVE or
NONNEGATIVE checks, and TEXT options whose help says "(an integer from A to B)". Each is given
values just past its range, far past it (2^64 and beyond, where a parser could wrap) and values
that are not numbers; every one must end in exit status 2 within seconds, with a message naming
the option, and never as a crash, a hang or an internal error. Numbers are decimal only: a
leading zero (which CLI11 reads as octal), hex, a space or a '+' is refused too, even where the
value it would stand for is in range.

    usage: cli_numbers.py LOCKSTEP CLI_MD
"""
import re
import subprocess
import sys

I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def options(cli_md):
    """(command words, option, kind, lo, hi) for every numeric option in the page."""
    command = None
    for line in open(cli_md, encoding="utf-8"):
        heading = re.match(r"^## lockstep(.*)$", line)
        if heading:
            command = heading.group(1).split()
            continue
        m = re.match(r"^  (?:-\w,)?(--[a-z0-9-]+) (\S+)(.*)$", line)
        if command is None or not m:
            continue
        name, kind, rest = m.groups()
        ranged = re.match(r"U?INT:INT", kind) and re.search(r"in \[(-?\d+) - (-?\d+)\]", rest)
        text = re.search(r"\(an integer from (\d+) to (\d+)\)", rest)
        if ranged:
            yield command, name, "int", int(ranged.group(1)), int(ranged.group(2))
        elif kind.startswith("UINT"):
            yield command, name, "int", 1 if ":POSITIVE" in kind else 0, U64_MAX
        elif kind.startswith("INT"):
            yield command, name, "int", 0 if ":NONNEGATIVE" in kind else I64_MIN, I64_MAX
        elif kind.startswith("FLOAT"):
            yield command, name, "float", 0 if ":POSITIVE" in kind else None, None
        elif kind.startswith("TEXT") and text:
            yield command, name, "int", int(text.group(1)), int(text.group(2))


# Forms that are not plain decimal, each standing for a value in range where a lenient parser
# reads it: octal, hex, spaces, a plus sign, a bare fraction.
# And zero written as a negative ("-0"): a '-' only before a value below zero.
NOT_DECIMAL = ["010", "0x10", "0X1", "0b1", " 5", "5 ", "+5", "1_000", "0o7", "-0", "-00"]
NOT_DECIMAL_FLOAT = ["0x10", "0x1p3", " 1", "1 ", "+1", ".5", "5.", "010", "inf", "1e", "1,5",
                     "-0", "-0.0", "-0e3"]


def bad_values(kind, lo, hi):
    if kind == "float":
        values = ["abc", "1.5.2", ""] + NOT_DECIMAL_FLOAT
        if lo is not None:  # POSITIVE: not above 0
            values += ["0", "-1", "-inf", "nan"]
        return values
    values = ["abc", "1.5", "1e3", "", "2^3", str(2**64), str(2**65 + 3), str(-(2**64) - 1)]
    values += [str(lo - 1), str(hi + 1)]
    return [v for v in values if not re.fullmatch(r"-?\d+", v) or not lo <= int(v) <= hi] + \
        NOT_DECIMAL


def main():
    lockstep, cli_md = sys.argv[1:3]
    failures, tried, names = [], 0, set()
    for command, name, kind, lo, hi in options(cli_md):
        names.add((" ".join(command), name))
        for value in bad_values(kind, lo, hi):
            argv = [lockstep, *command, f"{name}={value}"]
            tried += 1
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                                   stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                failures.append(f"{' '.join(argv[1:])}: still running after 20 s")
                continue
            out = r.stdout + r.stderr
            # A refusal in the Numbers rule's terms: never CLI11's "Value 1e3 not in range",
            # which reads as if 1e3 were a number out of range.
            if (r.returncode != 2 or name not in out or "internal error" in out or
                    (kind == "int" and "not in range" in out)):
                failures.append(f"{' '.join(argv[1:])}: exit {r.returncode}: {out.strip()[:300]}")
    print(f"{tried} values tried on {len(names)} numeric options")
    for f in failures:
        print("FAIL", f)
    if len(names) < 15:  # the page lists more: a parser that finds fewer is broken
        print(f"FAIL only {len(names)} numeric options found in {cli_md}")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
