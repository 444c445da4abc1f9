#!/usr/bin/env python3
"""No command writes over what it reads: every output option of every command pointed at each of
that command's inputs -- the input itself, a file inside an input directory, the directory itself,
and the same through a symbolic link and a hard link -- ends in exit status 2 naming both options
(or, where the aim is no output of the option's kind at all -- a link, a file where a directory
is written, a directory that is not empty -- naming the option and the output rule's reason),
and leaves every input byte for byte as it was.

The output options come from docs/cli.md (the binary's --help texts, kept current by the test
cli_doc_is_current): every option that names something the command writes. Each must have a case
below or be listed in NO_INPUTS (commands that read no local file); a new output option without
either fails the test.

    usage: outputs_onto_inputs.py LOCKSTEP CLI_MD SOURCE_DIR
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# (command, option) pairs whose command reads no local input to protect.
NO_INPUTS = {
    ("data synth", "--out"),
    ("keygen", "--out"),
    ("selftest", "--dump-programs"),
    ("kit fetch", "DEST"),
}
# The output rule's reasons (docs/cli.md, "Outputs") for an aim that is no output of its kind.
OUTPUT_RULE = ("a symbolic link", "not a directory", "not a file", "not empty")
# Help phrases that mark an option as something the command writes.
OUTPUT_WORDS = re.compile(r"^(output|write|the trace directory to create|kit directory to create|"
                          r"the secret key file|the HTML (file|page) to write|also write|run directory$|destination|"
                          r"keep parameters|keep the state on disk|with a device: write|"
                          r"write each replayed|write a receipt|write the JSON report|"
                          r"the directory the hand-off)", re.I)


def output_options(cli_md):
    found, command = set(), None
    for line in open(cli_md, encoding="utf-8"):
        heading = re.match(r"^## lockstep (.*)$", line)
        if heading:
            command = heading.group(1).strip()
            continue
        m = re.match(r"^  (--[a-z0-9-]+|[A-Z_]+) \S+(?: REQUIRED)?\s+(.*)$", line)
        if m and command and OUTPUT_WORDS.match(m.group(2)):
            found.add((command, m.group(1)))
    return found


def run(lockstep, args, check=True):
    r = subprocess.run([lockstep] + args, capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        sys.exit(f"setup failed: lockstep {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def snapshot(paths):
    """Every file under the paths, by path: (size, sha256); links as their target."""
    state = {}
    for p in paths:
        walk = [p] if os.path.isfile(p) else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        for f in walk:
            with open(f, "rb") as fh:
                state[f] = hashlib.sha256(fh.read()).hexdigest()
    return state


def build_fixture(lockstep, source, w):
    """A dataset, a trained run, its kit, an audit and its signed receipt, a key and small inputs
    under `w`; returns the case list: (command, option, argument list with "{OUT}", inputs the
    output is aimed at)."""
    P = lambda *a: os.path.join(w, *a)
    run(lockstep, ["data", "synth", "--out", P("data"), "--tokens", "100000"])
    run(lockstep, ["train", "--config", "tiny", "--data", P("data"), "--out", P("run"),
                   "--steps", "12", "--no-progress"])
    run(lockstep, ["kit", "build", "--run", P("run"), "--data", P("data"), "--out", P("kit")])
    audit = run(lockstep, ["audit", P("kit"), "--unit", "init"], check=False)
    open(P("audit.json"), "w").write(audit.stdout)
    run(lockstep, ["keygen", "--out", P("key")])
    run(lockstep, ["audit", P("kit"), "--unit", "init", "--receipt", P("receipt.json"),
                   "--sign-key", P("key")])
    open(P("text.txt"), "w").write("the quick brown fox\njumps over the lazy dog\n" * 50)
    open(P("tokens.bin"), "wb").write(bytes([116, 0, 0, 0, 104, 0, 0, 0, 101, 0, 0, 0]))
    open(P("batch.jsonl"), "w").write('{"prompt_tokens": [116, 104]}\n')
    spec = {"dtype": "uint16", "documents": [[[1, 2, 3, 4, 9]], [[5, 6, 7, 9]]]}
    open(P("spec.json"), "w").write(json.dumps(spec))
    subprocess.run([sys.executable, os.path.join(source, "tests/data/megatron_writer.py"),
                    P("corpus"), P("spec.json")], check=True)
    open(P("tokenizer.json"), "w").write("{}")
    ckpt, ckpt10 = P("run/checkpoints/step_000000012"), P("run/checkpoints/step_000000010")

    return [
        ("data tokenize", "--out", ["data", "tokenize", "--input", P("text.txt"), "--out", "{OUT}"],
         [P("text.txt")]),
        ("data import", "--out", ["data", "import", "--megatron", P("corpus"), "--tokenizer",
                                  P("tokenizer.json"), "--vocab", "10", "--eod", "9", "--out", "{OUT}"],
         [P("corpus.bin"), P("corpus.idx"), P("tokenizer.json")]),
        ("tokenizer train", "--out", ["tokenizer", "train", "--input", P("text.txt"), "--vocab",
                                      "300", "--out", "{OUT}"], [P("text.txt")]),
        ("train", "--out", ["train", "--config", "tiny", "--data", P("data"), "--out", "{OUT}",
                            "--steps", "1"], [P("data"), P("data", "manifest.json")]),
        ("train", "--spill-dir", ["train", "--config", "tiny", "--data", P("data"), "--out",
                                  P("run2"), "--steps", "1", "--spill-dir", "{OUT}"], [P("data")]),
        ("forward", "--out", ["forward", "--checkpoint", ckpt, "--tokens", P("tokens.bin"),
                              "--out", "{OUT}"],
         [ckpt, P(ckpt, "model.safetensors"), P(ckpt, "meta.json"), P("tokens.bin")]),
        ("generate", "--receipt", ["generate", "--checkpoint", ckpt, "--prompt-tokens",
                                   P("tokens.bin"), "--sign-key", P("key"), "--receipt", "{OUT}"],
         [ckpt, P(ckpt, "meta.json"), P("tokens.bin"), P("key")]),
        ("generate", "--receipt", ["generate", "--checkpoint", ckpt, "--batch", P("batch.jsonl"),
                                   "--data", P("data"), "--receipt", "{OUT}"],
         [P("batch.jsonl"), P("data"), P("data", "manifest.json")]),
        ("export", "--out", ["export", "--checkpoint", ckpt, "--format", "hf", "--data", P("data"),
                             "--out", "{OUT}"], [ckpt, P(ckpt, "model.safetensors"), P("data")]),
        ("replay", "--loss-log", ["replay", "--checkpoint", ckpt10, "--until-step", "12", "--data",
                                  P("data"), "--loss-log", "{OUT}"],
         [P("run", "state_hashes.jsonl"), P(ckpt10, "meta.json"), P("data", "manifest.json")]),
        ("replay", "--save-checkpoint-dir", ["replay", "--checkpoint", ckpt10, "--until-step", "12",
                                             "--data", P("data"), "--save-checkpoint-dir", "{OUT}"],
         [ckpt10, P("data")]),
        ("replay", "--spill-dir", ["replay", "--checkpoint", ckpt10, "--until-step", "12", "--data",
                                   P("data"), "--spill-dir", "{OUT}"], [ckpt10, P("data")]),
        ("kit build", "--out", ["kit", "build", "--run", P("run"), "--data", P("data"), "--out", "{OUT}"],
         [P("run"), P("run", "state_hashes.jsonl"), P("data")]),
        ("audit", "--json-out", ["audit", P("kit"), "--unit", "init", "--json-out", "{OUT}"],
         [P("kit", "kit.json"), P("kit")]),
        ("report", "--out", ["report", P("kit"), "--audit", P("audit.json"), "--out", "{OUT}"],
         [P("kit", "kit.json"), P("audit.json")]),
        ("report", "--out", ["report", P("kit"), "--receipt", P("receipt.json"), "--metrics",
                             P("run", "metrics.jsonl"), "--out", "{OUT}"],
         [P("receipt.json"), P("run", "metrics.jsonl")]),
        ("audit", "--receipt", ["audit", P("kit"), "--unit", "init", "--sign-key", P("key"),
                                "--receipt", "{OUT}"], [P("kit", "kit.json"), P("key")]),
        ("audit", "--report", ["audit", P("kit"), "--unit", "init", "--receipt", P("r2.json"),
                               "--report", "{OUT}"], [P("kit", "kit.json"), P("kit")]),
        ("coverage", "--out", ["coverage", "--kit", P("kit"), P("receipt.json"), "--out", "{OUT}"],
         [P("kit", "kit.json"), P("receipt.json")]),
        ("coverage", "--json", ["coverage", "--kit", P("kit"), P("receipt.json"), "--metrics",
                                P("run", "metrics.jsonl"), "--out", P("c.html"), "--json", "{OUT}"],
         [P("kit", "trajectory.json"), P("receipt.json"), P("run", "metrics.jsonl")]),
        ("trace", "--out", ["trace", "--checkpoint", ckpt10, "--data", P("data"), "--step", "11",
                            "--out", "{OUT}"], [ckpt10, P("data")]),
    ]


def main():
    lockstep, cli_md, source = sys.argv[1:4]
    w = tempfile.mkdtemp(prefix="lockstep_outputs_")
    try:
        P = lambda *a: os.path.join(w, *a)
        cases = build_fixture(lockstep, source, w)
        covered = {(c, o) for c, o, _, _ in cases} | NO_INPUTS
        missing = output_options(cli_md) - covered
        if missing:
            sys.exit(f"output options without a case: {sorted(missing)}")

        protected = [P("data"), P("run"), P("kit"), P("audit.json"), P("receipt.json"), P("key"),
                     P("key.pub"),
                     P("text.txt"), P("tokens.bin"), P("batch.jsonl"), P("corpus.bin"),
                     P("corpus.idx"), P("tokenizer.json")]
        before = snapshot(protected)
        failures, tried = [], 0
        for command, option, args, targets in cases:
            aims = []
            for t in targets:
                aims.append(t)
                aims.append(os.path.join(t, "new") if os.path.isdir(t) else None)
                link = P(f"link{len(os.listdir(w))}")
                os.symlink(t, link)
                aims.append(link)
                if os.path.isfile(t):
                    hard = P(f"hard{len(os.listdir(w))}")
                    os.link(t, hard)
                    aims.append(hard)
            for aim in filter(None, aims):
                tried += 1
                r = run(lockstep, [aim if a == "{OUT}" else a for a in args], check=False)
                said = r.stdout + r.stderr
                # Onto an input ("would write"), or, where the aim is no output of the option's
                # kind at all (a link, a file for a directory, a non-empty directory), by the
                # output rule first (outputs_hostile_targets.py tests that rule as a class).
                reasons = ("would write",) + (OUTPUT_RULE if os.path.islink(aim) or
                                              os.path.exists(aim) else ())
                if r.returncode != 2 or option not in said or not any(x in said for x in reasons):
                    failures.append(f"{command} {option} {aim}: exit {r.returncode}: {said.strip()[-300:]}")
        after = snapshot(protected)
        changed = [f for f in before if before[f] != after.get(f)]
        for f in changed:
            failures.append(f"input changed: {f}")
        if failures:
            print("\n".join(failures))
            sys.exit(f"{len(failures)} failure(s) of {tried} tries")
        print(f"{tried} outputs aimed at inputs over {len(cases)} cases: every one refused, "
              f"every input unchanged")
    finally:
        shutil.rmtree(w, ignore_errors=True)


if __name__ == "__main__":
    main()
