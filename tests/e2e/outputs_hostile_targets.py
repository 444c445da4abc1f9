#!/usr/bin/env python3
"""The one output rule (docs/cli.md, "Outputs"), tested as a class: every output option of every
command (as docs/cli.md lists them) aimed at what no command may write into or over -- a
character device, a FIFO, a symbolic link (to a file of the user's, and dangling), a directory,
a regular file where only a new one may be made, "DIR/", a path in a missing directory and '' --
ends in exit status 2 naming the option, with the target and everything around it unchanged
(no staging file or directory left behind).

Every output that is a directory aimed at an empty mount point (a tmpfs, where this process may
mount one; said to be skipped where it may not): filled in place (exit 0), or, by a writer that
stages beside it and renames, refused before any work as a mount point (exit 2) -- never a rename
error after the work, nothing left beside it.

Then the writers that stage: kit build, export (hf and gguf) and keygen leave a user's
directories at staging-like names alone (among them the exact name the command would try first:
the process's pid is known because the shell execs it), and a write that fails part-way
(RLIMIT_FSIZE, as a full disk would) ends in exit 2 naming the file, with the command's own
staging removed and no output.

    usage: outputs_hostile_targets.py LOCKSTEP CLI_MD SOURCE_DIR
"""
import hashlib
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outputs_onto_inputs import build_fixture, output_options, run  # noqa: E402

# What each output may be (core OutputKind): file (absent or a regular file, replaced whole),
# newfile (absent), newdir (absent or empty), dir (absent or a directory).
KINDS = {
    ("data synth", "--out"): "newdir", ("data tokenize", "--out"): "newdir",
    ("data import", "--out"): "newdir", ("tokenizer train", "--out"): "newdir",
    ("train", "--out"): "dir", ("train", "--spill-dir"): "dir",
    ("forward", "--out"): "file", ("generate", "--receipt"): "file",
    ("export", "--out"): "newdir", ("replay", "--loss-log"): "file",
    ("replay", "--save-checkpoint-dir"): "dir", ("replay", "--spill-dir"): "dir",
    ("kit build", "--out"): "newdir", ("kit fetch", "DEST"): "dir",
    ("audit", "--json-out"): "file", ("audit", "--receipt"): "file", ("audit", "--report"): "file",
    ("coverage", "--out"): "file", ("coverage", "--json"): "file", ("report", "--out"): "file",
    ("trace", "--out"): "newdir", ("keygen", "--out"): "newfile",
    ("selftest", "--dump-programs"): "dir",
}


def tree(root):
    """Everything under `root`, by relative path: its type and, for files, a digest; for links,
    the target; for devices, the device number."""
    state = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    state[rel] = ("file", hashlib.sha256(fh.read()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir",)
            else:
                state[rel] = (stat.S_IFMT(st.st_mode), st.st_rdev)
    return state


def hostile_targets(h, kind):
    """(label, path) pairs under `h` that an output of `kind` must refuse; made here."""
    os.makedirs(h)
    victim = os.path.join(h, "victim.txt")
    with open(victim, "w") as f:
        f.write("the user's file\n")
    aims = []
    device = os.path.join(h, "chardev")
    try:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        aims.append(("a character device", device))
    except PermissionError:
        print("note: no character device case (mknod needs root): that kind is not checked")
    fifo = os.path.join(h, "fifo")
    os.mkfifo(fifo)
    aims.append(("a FIFO", fifo))
    link = os.path.join(h, "link")
    os.symlink(victim, link)
    aims.append(("a symbolic link to a file", link))
    dangling = os.path.join(h, "dangling")
    os.symlink(os.path.join(h, "nothing-here"), dangling)
    aims.append(("a dangling symbolic link", dangling))
    aims.append(("''", ""))
    empty_dir = os.path.join(h, "emptydir")
    os.mkdir(empty_dir)
    full_dir = os.path.join(h, "fulldir")
    os.mkdir(full_dir)
    with open(os.path.join(full_dir, "keep.txt"), "w") as f:
        f.write("keep\n")
    if kind in ("file", "newfile"):
        aims.append(("a directory", empty_dir))
        aims.append(("DIR/", empty_dir + "/"))
        aims.append(("a missing DIR/", os.path.join(h, "missing") + "/"))
        aims.append(("a file in a missing directory", os.path.join(h, "missing", "out")))
    if kind == "newfile":
        aims.append(("an existing file", victim))
    if kind == "newdir":
        aims.append(("a directory that is not empty", full_dir))
    if kind in ("newdir", "dir"):
        aims.append(("a regular file", victim))
    return aims


def run_with(lockstep, args, cwd=None, fsize=None, prefix=None):
    """lockstep ARGS, optionally under RLIMIT_FSIZE (SIGXFSZ ignored, so a write past the limit
    fails with EFBIG as one past a full disk fails with ENOSPC), optionally exec'd by a shell
    that first runs `prefix` (with $$ the pid lockstep will have)."""
    def limits():
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    argv = [lockstep] + args
    if prefix:
        argv = ["sh", "-c", prefix + ' && exec "$@"', "sh"] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd,
                          preexec_fn=limits)


def case_kind(case):
    return case[4] if len(case) > 4 else KINDS[(case[0], case[1])]


def mount_points(lockstep, cases, mnt, failures):
    """Each directory output at a fresh, empty tmpfs mounted at `mnt`. Returns "" when they ran,
    else why they were skipped (said in the test's last line)."""
    os.makedirs(mnt)
    holder = os.path.dirname(mnt)
    for n, case in enumerate(cases):
        command, option, args = case[:3]
        if case_kind(case) not in ("newdir", "dir"):
            continue
        m = subprocess.run(["mount", "-t", "tmpfs", "none", mnt], capture_output=True, text=True)
        if m.returncode != 0:
            return f"; mount points skipped: mount -t tmpfs failed ({m.stderr.strip()[-120:]})"
        try:
            r = run_with(lockstep, [mnt if a == "{OUT}" else a for a in args])
            said = (r.stdout + r.stderr).strip()
            inside = os.listdir(mnt)
        finally:
            subprocess.run(["umount", mnt], check=True)
        beside = [e for e in os.listdir(holder) if e.startswith(".mnt.")]
        refused = r.returncode == 2 and f"{mnt}: a mount point" in said and not inside
        # A case whose other arguments stop it before its output (they are made for the checks of
        # the output alone) says nothing of it; it names no mount point and leaves nothing.
        stopped_before = r.returncode == 2 and mnt not in said and not inside
        if r.returncode != 0 and not refused and not stopped_before or beside:
            failures.append(f"{command} {option} at an empty mount point: exit {r.returncode}, "
                            f"left beside it {beside}: {said[-300:]}")
    return ""


def main():
    lockstep, cli_md, source = sys.argv[1:4]
    lockstep = os.path.abspath(lockstep)  # some commands run in a directory of their own
    w = tempfile.mkdtemp(prefix="lockstep_hostile_outputs_")
    failures, tried = [], 0
    try:
        P = lambda *a: os.path.join(w, *a)
        cases = build_fixture(lockstep, source, w)
        # A model GGUF expresses (tiny has sliding windows with QK-norm, which it cannot).
        with open(os.path.join(source, "configs", "tiny.yaml")) as f:
            plain = re.sub(r"(?m)^(  window:) .*$", r"\1 0", f.read())
        with open(P("plain.yaml"), "w") as f:
            f.write(plain)
        run(lockstep, ["train", "--config", P("plain.yaml"), "--data", P("data"), "--out",
                       P("plain"), "--steps", "2", "--no-progress"])
        plain_ckpt = P("plain/checkpoints/step_000000002")
        cases += [
            ("data synth", "--out", ["data", "synth", "--tokens", "1000", "--out", "{OUT}"]),
            ("keygen", "--out", ["keygen", "--out", "{OUT}"]),
            ("kit fetch", "DEST", ["kit", "fetch", "--no-progress", "file://" + P("kit"), "{OUT}"]),
            ("selftest", "--dump-programs", ["selftest", "--device", "opencl", "--dump-programs",
                                             "{OUT}"]),
            ("export", "--out", ["export", "--checkpoint", plain_ckpt, "--format", "gguf",
                                 "--out", "{OUT}"], None, "newfile"),
        ]
        missing = output_options(cli_md) - set(KINDS)
        if missing:
            sys.exit(f"output options without a kind here: {sorted(missing)}")
        missing = set(KINDS) - {(c[0], c[1]) for c in cases}
        if missing:
            sys.exit(f"output options without a case: {sorted(missing)}")

        for n, case in enumerate(cases):
            command, option, args = case[:3]
            kind = case_kind(case)
            h = P(f"hostile{n}")
            for label, aim in hostile_targets(h, kind):
                before = tree(h)
                tried += 1
                r = run_with(lockstep, [aim if a == "{OUT}" else a for a in args])
                said = (r.stdout + r.stderr).strip()
                if r.returncode != 2 or option not in said:
                    failures.append(f"{command} {option} at {label} ({aim!r}): exit {r.returncode}: "
                                    f"{said[-300:]}")
                after = tree(h)
                if after != before:
                    changed = sorted(set(before.items()) ^ set(after.items()))
                    failures.append(f"{command} {option} at {label}: changed {changed[:6]}")
            shutil.rmtree(h)

        mount_note = mount_points(lockstep, cases, P("mnt"), failures)
        tried += 0 if mount_note else sum(1 for c in cases if case_kind(c) in ("newdir", "dir"))

        # Staging names: a user's directories at names the writers used, or would try first,
        # survive a successful write; only the output is added beside them.
        ckpt = P("run/checkpoints/step_000000012")
        staged = [
            ("kit build", "K", ["kit", "build", "--run", P("run"), "--data", P("data"), "--out", "K"]),
            ("export hf", "E", ["export", "--checkpoint", ckpt, "--format", "hf", "--out", "E"]),
            ("export gguf", "G.gguf", ["export", "--checkpoint", plain_ckpt, "--format", "gguf",
                                       "--out", "G.gguf"]),
            ("keygen", "S", ["keygen", "--out", "S"]),
        ]
        for n, (what, name, args) in enumerate(staged):
            d = P(f"staging{n}")
            os.makedirs(d)
            for user in (f".tmp-{name}", f".{name}.tmp", f".tmp-{name}-1"):
                os.makedirs(os.path.join(d, user))
                with open(os.path.join(d, user, "mine.txt"), "w") as f:
                    f.write("a user's file\n")
            before = tree(d)
            tried += 1
            # The exact first staging name of this process: made by the shell that becomes it.
            r = run_with(lockstep, args, cwd=d,
                         prefix=f"mkdir .{name}.$$-0.tmp && echo mine > .{name}.$$-0.tmp/mine.txt")
            after = tree(d)
            lost = {k: v for k, v in before.items() if after.get(k) != v}
            added = {k.split("/")[0] for k in after if k not in before}
            added -= {name, name + ".pub"}
            first = [k for k in added if k.endswith("-0.tmp")]
            if r.returncode != 0 or lost or len(added - set(first)) or len(first) != 1:
                failures.append(f"{what} beside a user's staging-named directories: exit "
                                f"{r.returncode}, lost {sorted(lost)}, left {sorted(added)}: "
                                f"{(r.stdout + r.stderr).strip()[-300:]}")
            shutil.rmtree(d)

        # A write that fails part-way: the command's own staging goes, nothing appears.
        failing = [
            ("kit build", "K", ["kit", "build", "--run", P("run"), "--data", P("data"), "--out", "K"],
             4096),
            ("export gguf", "G.gguf", ["export", "--checkpoint", plain_ckpt, "--format", "gguf",
                                       "--out", "G.gguf"], 4096),
            ("export hf", "E", ["export", "--checkpoint", ckpt, "--format", "hf", "--out", "E"],
             4096),
            ("keygen", "S", ["keygen", "--out", "S"], 16),
            ("coverage --out", "c.html", ["coverage", "--kit", P("kit"), P("receipt.json"),
                                          "--out", "c.html"], 64),
        ]
        for n, (what, name, args, limit) in enumerate(failing):
            d = P(f"failing{n}")
            os.makedirs(d)
            tried += 1
            r = run_with(lockstep, args, cwd=d, fsize=limit)
            left = os.listdir(d)
            said = (r.stdout + r.stderr).strip()
            if r.returncode != 2 or left or "write" not in said and "copying" not in said:
                failures.append(f"{what} with writes failing past {limit} bytes: exit "
                                f"{r.returncode}, left {left}: {said[-300:]}")
            r = run_with(lockstep, args, cwd=d)  # and the same command then succeeds
            if r.returncode not in ((0, 1) if what.startswith("coverage") else (0,)):
                failures.append(f"{what} after a failed write: exit {r.returncode}: "
                                f"{(r.stdout + r.stderr).strip()[-300:]}")
            shutil.rmtree(d)
    finally:
        shutil.rmtree(w, ignore_errors=True)
    if failures:
        print("\n".join(failures))
        sys.exit(f"{len(failures)} failure(s) of {tried} tries")
    print(f"{tried} outputs aimed at devices, FIFOs, links, directories, '', DIR/, missing "
          f"directories, mount points, staging names and failing writes: every one refused or "
          f"kept whole, nothing of the user's touched{mount_note}")


if __name__ == "__main__":
    main()
