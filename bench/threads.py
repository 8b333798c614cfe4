#!/usr/bin/env python3
"""Per-thread CPU time of a command (or of a running process), sampled from
/proc/PID/task/*/stat, and what it predicts for scaling (issue 15).

The busiest thread's share of all CPU time is taken as the serial fraction
s (among threads whose name no other thread has: a pool of workers of one
name splits its work, and more cores would split it further; except
ckpt-hash threads, each of which is one SHA-256 chain over its files, so
each counts alone; their readers, ckpt-hashread, serve any lane's next
block, a pool like the workers): that thread's work cannot be spread, so Amdahl's law
bounds the speedup on N cores at 1 / (s + (1 - s) / N). That assumes the
serial work runs alone; in ckpt's pipelines it runs beside the workers, so
the speedup can reach min(N, 1 / s) ("pipelined"). Both are printed:

  STAGE: 3.19 CPU-s (4.49 CPU-s/GB) in 1.70 s wall (1.9 cores busy) over 6 threads; busiest
  'ckpt' 1.41 CPU-s = 44.2% -> Amdahl 2.1x at 16 cores, 2.2x at 64
  (pipelined 2.3x, 2.3x)

Neither counts waiting: threads that sleep on each other's results (a slot
ring, a lock) cost no CPU, so the prediction holds only where the cores
stay busy. On the machine itself, "cores busy" (CPU-s over wall) below
the core count shows such waits: on 16-core hosts, pack of 4 shards was
predicted 10x (build 6cabca9, 710 MB, an H100 host) and ran 3.7x (a later
build, 3.1 GB, an H200 host), with 7 of 16 cores busy.

Run a command with the thread count of the machine you predict for (e.g.
--threads 16 on 2 cores): the shares are CPU time, which sharing the cores
does not change much, and the thread structure (how many hash lanes) is
then the one that machine would have.

Usage:
  threads.py [--label STAGE] [--bytes N] [--tsv FILE] -- CMD ARGS...
      runs CMD (stdout to /dev/null unless --keep-stdout), samples it
  threads.py [--label STAGE] [--bytes N] --pid PID --until-file PATH
      samples a running process until PATH exists (e.g. a commit marker)
      or --seconds S have passed
--bytes: the logical bytes the stage moved, for CPU-s per GB.
Threads are sampled every 20 ms; a thread's last 20 ms before it exits can
be missed (clock ticks are 10 ms anyway).
"""
import argparse
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
# Roles several threads share whose threads are each serial: a hash lane
# hashes its files' chunks in order, one chain at a time.
CHAINS = {"ckpt-hash"}


def sample(pid, seen):
    """Adds each live thread's (comm, utime+stime seconds) to seen[tid]."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        seen[tid] = (comm, cpu)
    return True


def report(label, seen, wall, nbytes, tsv):
    total = sum(c for _, c in seen.values())
    if total <= 0:
        print(f"{label}: no CPU time sampled")
        return
    tid, (comm, busiest) = max(seen.items(), key=lambda kv: kv[1][1])
    # Threads of a role several threads share (ckpt-encode, ckpt-decode)
    # split their work: with only 2 cores each holds a large share that
    # more cores would divide. The serial part is the busiest thread of a
    # role only one thread has (the hash thread, the output, the caller).
    names = [c for c, _ in seen.values()]
    single = [(c, t) for c, t in seen.values() if names.count(c) == 1 or c in CHAINS]
    if single:
        comm, busiest = max(single, key=lambda x: x[1])
    s = busiest / total
    amdahl = {n: 1 / (s + (1 - s) / n) for n in (2, 16, 64)}
    piped = {n: min(n, 1 / s) if s > 0 else n for n in (16, 64)}
    per_gb = f" ({total / (nbytes / 1e9):.2f} CPU-s/GB)" if nbytes else ""
    busy = f" ({total / wall:.1f} cores busy)" if wall > 0 else ""
    print(f"{label}: {total:.2f} CPU-s{per_gb} in {wall:.2f} s wall{busy} over {len(seen)} threads; "
          f"busiest '{comm}' {busiest:.2f} CPU-s = {100 * s:.1f}% -> Amdahl "
          f"{amdahl[16]:.1f}x at 16 cores, {amdahl[64]:.1f}x at 64 (pipelined {piped[16]:.1f}x, {piped[64]:.1f}x)")
    top = sorted(seen.values(), key=lambda x: -x[1])[:6]
    print("    threads by CPU-s: " + ", ".join(f"{c}={t:.2f}" for c, t in top))
    if tsv:
        with open(tsv, "a") as f:
            f.write(f"{label}\t{total:.3f}\t{wall:.3f}\t{len(seen)}\t{busiest:.3f}\t{s:.4f}\t"
                    f"{amdahl[16]:.2f}\t{amdahl[64]:.2f}\t{nbytes}\t{piped[16]:.2f}\t{piped[64]:.2f}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="run")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--tsv")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--until-file")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--keep-stdout", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    seen = {}
    t0 = time.monotonic()
    if a.pid:
        base = {}
        sample(a.pid, base)  # CPU the daemon had before: not this stage's
        while time.monotonic() - t0 < a.seconds and sample(a.pid, seen):
            if a.until_file and os.path.exists(a.until_file):
                break
            time.sleep(0.02)
        seen = {t: (c, cpu - base.get(t, (c, 0))[1]) for t, (c, cpu) in seen.items()}
        seen = {t: v for t, v in seen.items() if v[1] > 0}
        report(a.label, seen, time.monotonic() - t0, a.bytes, a.tsv)
        return 0
    if not cmd:
        ap.error("give a command after --, or --pid")
    p = subprocess.Popen(cmd, stdout=None if a.keep_stdout else subprocess.DEVNULL)
    while p.poll() is None:
        sample(p.pid, seen)
        time.sleep(0.02)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(f"{a.label}: {' '.join(cmd)} failed with status {p.returncode}", file=sys.stderr)
        return 1
    report(a.label, seen, wall, a.bytes, a.tsv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
