#!/usr/bin/env bash
# The README's performance table, from a benchmark report's figures: each
# figure beside its target (the ones bench-mount.sh and bench-write.sh
# check) and "MISSED" where it missed, so the README can never read better
# than the report. bench/report.sh runs it for every report (its "Targets"
# section is this table) and, for the full run, rewrites the README's
# block between the markers
#
#   <!-- bench-table:begin -->
#   <!-- bench-table:end -->
#
# Usage: bench/readme_table.sh [--threads N] [--quick] [--date TEXT]
#                              [--readme README.md] REPORT.tsv
#   --threads N   the thread count of the figures (default: nproc)
#   --quick       label the table as a quick (smoke) run
#   --date TEXT   when the run was made, for the heading
#   --readme F    rewrite F's block between the markers instead of printing
#                 the table (refused for a quick run: it is not the report)
set -euo pipefail
threads=$(nproc)
quick=0
readme=
date_txt=
while [ $# -gt 1 ]; do
    case $1 in
    --threads) threads=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    --date) date_txt=${2:?}; shift 2 ;;
    --readme) readme=${2:?}; shift 2 ;;
    *) break ;;
    esac
done
tsv=${1:?usage: bench/readme_table.sh [--threads N] [--quick] [--readme README.md] REPORT.tsv}
[ -r "$tsv" ] || { echo "readme_table: cannot read $tsv" >&2; exit 1; }
if [ -n "$readme" ] && [ "$quick" = 1 ]; then
    echo "readme_table: a quick run does not go into $readme (run make bench)" >&2
    exit 1
fi

table=$(awk -F'\t' -v N="$threads" -v quick="$quick" -v when="$date_txt" '
NR == 1 && $1 == "bench" { next }
{
    key = $1 SUBSEP $3 SUBSEP $4 SUBSEP $5 SUBSEP $6
    v[key] = $7
    if ($2 == "bf16" && ($1 == "mount" || $1 == "write") && $3 + 0 > L + 0) L = $3
    if ($2 == "bf16" && $1 == "pack" && (S == "" || $3 + 0 < S + 0)) S = $3
}
function get(bench, by, sys, t, m,   k) {
    k = bench SUBSEP by SUBSEP sys SUBSEP t SUBSEP m
    return (k in v) ? v[k] : ""
}
function fmt(x, unit) { return x == "" ? "-" : sprintf(unit, x) }
function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : a / b }
# One row: what, ckptfs figure, peer figure, ratio, target text, met?
function row(what, a, b, r, goal, op, unit,   verdict, tg) {
    verdict = ""
    tg = "-"
    if (goal != "") {
        tg = op " " goal
        if (r == "") verdict = "not measured"
        else if ((op == ">=" && r + 0 >= goal + 0) || (op == "<=" && r + 0 <= goal + 0)) verdict = "met"
        else verdict = "**MISSED**"
    }
    printf "| %s | %s | %s | %s | %s | %s |\n", what, a, b, (r == "" ? "-" : sprintf("%.2f", r) (unit == "" ? "x" : unit)), tg (unit == "" && goal != "" ? "x" : (goal != "" ? unit : "")), verdict
}
END {
    if (L == "") { print "readme_table: no mount or write figures in the report" > "/dev/stderr"; exit 1 }
    gb = sprintf("%.2f GB", L / 1e9)
    printf "| %s%s bf16 checkpoint, %d threads | ckptfs | peer | ratio | target | |\n", (quick ? "QUICK RUN (smoke test, not the report): " : ""), gb, N
    print "|---|---|---|---|---|---|"
    both = get("mount", L, "ckptfs-both", N, "cold_seq_mbps"); sq = get("mount", L, "squashfuse", "-", "cold_seq_mbps")
    row("cold read MB/s, compressed+encrypted vs squashfuse (gzip)", fmt(both, "%.0f"), fmt(sq, "%.0f"), ratio(both, sq), "4.00", ">=", "")
    enc = get("mount", L, "ckptfs-enc", N, "cold_seq_mbps"); gc = get("mount", L, "gocryptfs", "-", "cold_seq_mbps")
    row("cold read MB/s, encrypted vs gocryptfs", fmt(enc, "%.0f"), fmt(gc, "%.0f"), ratio(enc, gc), "", "", "")
    pl = get("mount", L, "ckptfs-plain", N, "cold_seq_mbps"); na = get("mount", L, "native", "-", "cold_seq_mbps")
    row("cold read MB/s, stored vs native", fmt(pl, "%.0f"), fmt(na, "%.0f"), ratio(pl, na), "0.70", ">=", "")
    row("cold read MB/s, compressed+encrypted vs native", fmt(both, "%.0f"), fmt(na, "%.0f"), ratio(both, na), "1.00", ">=", "")
    worst = ""; wm = ""
    split("plain comp enc both", modes, " ")
    for (i = 1; i <= 4; i++) {
        x = get("mount", L, "ckptfs-" modes[i], N, "warm_seq_mbps")
        if (x != "" && (worst == "" || x + 0 < worst + 0)) { worst = x; wm = modes[i] }
    }
    nw = get("mount", L, "native", "-", "warm_seq_mbps")
    row("warm re-read MB/s, slowest ckptfs mode (" wm ") vs native", fmt(worst, "%.0f"), fmt(nw, "%.0f"), ratio(worst, nw), "0.90", ">=", "")
    bw = get("mount", L, "ckptfs-both", N, "warm_seq_mbps"); gw = get("mount", L, "gocryptfs", "-", "warm_seq_mbps")
    row("warm re-read MB/s, compressed+encrypted vs gocryptfs", fmt(bw, "%.0f"), fmt(gw, "%.0f"), ratio(bw, gw), "", "", "")
    cp = get("write", L, "ckptfs", N, "cp_s"); done = get("write", L, "ckptfs", N, "done_s")
    ns = get("write", L, "native", "-", "done_s"); nc = get("write", L, "native", "-", "cp_s")
    row("write s: `cp -r` into the mount returns vs native `cp -r` + `sync` (lower is better)", fmt(cp, "%.2f s"), fmt(ns, "%.2f s"), ratio(cp, ns), "1.20", "<=", "")
    row("write s: the same vs native `cp -r` alone, page cache only", fmt(cp, "%.2f s"), fmt(nc, "%.2f s"), ratio(cp, nc), "1.20", "<=", "")
    c4 = get("write", L, "ckptfs4", N, "cp_s"); n4 = get("write", L, "native4", "-", "done_s")
    row("write s: 4 writers at once into the mount return vs native 4 writers + `sync`", fmt(c4, "%.2f s"), fmt(n4, "%.2f s"), ratio(c4, n4), "1.20", "<=", "")
    per = (cp == "" || done == "") ? "" : (done - cp) / (L / 250e6)
    row("packing after `cp -r`, s per 250 MB", fmt(per, "%.2f s"), "-", per, "1.00", "<=", " s")
    ck = get("write", L, "ckptfs", N, "done_mbps"); ncs = get("write", L, "native", "-", "done_mbps")
    row("write until packed MB/s vs native `cp -r` + `sync`", fmt(ck, "%.0f"), fmt(ncs, "%.0f"), ratio(ck, ncs), "", "", "")
    r1 = get("write", L, "ckptfs", N, "rss_kib"); r2 = get("write", L, "ckptfs-key", N, "rss_kib")
    rw = (r2 + 0 > r1 + 0) ? r2 : r1
    row("write daemon peak RSS MiB", fmt(rw == "" ? "" : rw / 1024, "%.0f"), "-", rw == "" ? "" : rw / 1024, "512", "<=", " MiB")
    rr = get("mount", L, "ckptfs-both", N, "rss_kib"); gr = get("mount", L, "gocryptfs", "-", "rss_kib")
    row("read daemon peak RSS MiB (cache 256M) vs gocryptfs", fmt(rr == "" ? "" : rr / 1024, "%.0f"), fmt(gr == "" ? "" : gr / 1024, "%.0f"), ratio(rr, gr), "", "", "")
    pk = get("pack", L, "ckpt-compressed", N, "pack_mbps"); ms = get("pack", L, "mksquashfs", N, "pack_mbps")
    row("`ckpt pack` MB/s vs `mksquashfs -comp gzip -b 1M`", fmt(pk, "%.0f"), fmt(ms, "%.0f"), ratio(pk, ms), "", "", "")
    cr = get("pack", S, "ckpt-compressed", N, "ratio"); mr = get("pack", S, "mksquashfs", N, "ratio")
    row(sprintf("compression ratio, bf16 (%.0f MB) vs mksquashfs", S / 1e6), fmt(cr, "%.3f"), fmt(mr, "%.3f"), ratio(cr, mr), "", "", "")
}' "$tsv")

heading="Generated by \`bench/readme_table.sh\` from [bench/report.tsv](bench/report.tsv)${date_txt:+ (run of $date_txt)}; the targets are the ones \`bench/bench-mount.sh\` and \`bench/bench-write.sh\` check. Do not edit by hand: \`make bench\` rewrites it."
if [ -z "$readme" ]; then
    printf '%s\n' "$table"
    exit 0
fi
grep -q '^<!-- bench-table:begin -->$' "$readme" && grep -q '^<!-- bench-table:end -->$' "$readme" ||
    { echo "readme_table: $readme has no bench-table markers" >&2; exit 1; }
block=$(printf '%s\n\n%s\n' "$heading" "$table")
awk -v block="$block" '
/^<!-- bench-table:begin -->$/ { print; print ""; print block; print ""; skip = 1; next }
/^<!-- bench-table:end -->$/ { skip = 0 }
!skip' "$readme" >"$readme.tmp"
mv "$readme.tmp" "$readme"
echo "rewrote the table in $readme" >&2
