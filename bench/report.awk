# Turns the results of bench-pack.sh, bench-mount.sh and bench-write.sh
# (their --tsv lines: bench dtype bytes system threads metric value) into the
# tables of bench/report.md, and writes the data files bench/report.gp
# plots. Run by bench/report.sh:
#
#   awk -F'\t' -v N=THREADS -v sizes="100M=BYTES 1G=BYTES" -v scale=1G=BYTES \
#       -v dtypes="bf16=BYTES f16=BYTES" -v datdir=DIR -f report.awk results.tsv
#
# N: the thread count of the size tables; sizes: the bf16 checkpoints, small
# to large; scale: the one measured at every thread count; dtypes: the
# checkpoints of the compression table.

function get(b, dt, by, sys, th, m) {
    return ((b, dt, by, sys, th, m) in v) ? v[b, dt, by, sys, th, m] : ""
}
function num(x) { return x == "" ? "?" : x }
function f1(x) { return x == "" ? "-" : sprintf("%.1f", x) }
function f0(x) { return x == "" ? "-" : sprintf("%.0f", x) }
function mib(kib) { return kib == "" ? "-" : sprintf("%.0f", kib / 1024) }
function rat(a, b) { return (a == "" || b == "" || b == 0) ? "-" : sprintf("%.2f", a / b) }
function fmt_size(bytes) {
    return bytes >= 1e9 ? sprintf("%.2f GB", bytes / 1e9) : sprintf("%.0f MB", bytes / 1e6)
}
function split_pairs(s, lab, byt,    n, i, kv, a) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) {
        split(a[i], kv, "=")
        lab[i] = kv[1]
        byt[i] = kv[2]
    }
    return n
}
# The highest RSS over the ckptfs read modes at THREADS.
function ckptfs_read_rss(by, th,    m, r, best) {
    best = ""
    for (m = 1; m <= 4; m++) {
        r = get("mount", "bf16", by, "ckptfs-" mode[m], th, "rss_kib")
        if (r != "" && (best == "" || r + 0 > best + 0)) best = r
    }
    return best
}
function sumrow(label, a, b, unit) {
    printf "| %s | %s | %s | %s |\n", label, unit == "MiB" ? mib(a) : f1(a), unit == "MiB" ? mib(b) : f1(b), rat(a, b)
}

$1 == "bench" { next }
{ v[$1, $2, $3, $4, $5, $6] = $7 }

END {
    mode[1] = "plain"; mode[2] = "comp"; mode[3] = "enc"; mode[4] = "both"
    modename["plain"] = "ckptfs stored"; modename["comp"] = "ckptfs compressed"
    modename["enc"] = "ckptfs encrypted"; modename["both"] = "ckptfs compressed+encrypted"
    ns = split_pairs(sizes, slab, sbyt)
    split(scale, sc, "=")
    scale_lab = sc[1]; scale_by = sc[2]
    nd = split_pairs(dtypes, dlab, dbyt)
    L = sbyt[ns]; LL = slab[ns]
    # Thread counts measured at the scaling size, ascending.
    nt = 0
    for (k in v) {
        split(k, p, SUBSEP)
        if (p[1] == "pack" && p[3] == scale_by && p[4] == "ckpt-compressed" && !(p[5] in seen_t)) {
            seen_t[p[5]] = 1
            tl[++nt] = p[5] + 0
        }
    }
    for (i = 2; i <= nt; i++)
        for (j = i; j > 1 && tl[j - 1] > tl[j]; j--) { x = tl[j]; tl[j] = tl[j - 1]; tl[j - 1] = x }

    # ---------------------------------------------------------- summary
    printf "## Summary: %s bf16 checkpoint (%s), %d threads\n\n", LL, fmt_size(L), N
    print "Throughput in MB/s (10^6 bytes of checkpoint per second); a ratio above 1 means ckptfs is faster."
    print ""
    print "| comparison | ckptfs | peer | ckptfs / peer |"
    print "|---|---|---|---|"
    nat = get("mount", "bf16", L, "native", "-", "cold_seq_mbps")
    sq = get("mount", "bf16", L, "squashfuse", "-", "cold_seq_mbps")
    gc = get("mount", "bf16", L, "gocryptfs", "-", "cold_seq_mbps")
    sumrow("cold read, compressed+encrypted vs squashfuse (gzip)", get("mount", "bf16", L, "ckptfs-both", N, "cold_seq_mbps"), sq)
    sumrow("cold read, compressed vs squashfuse (gzip)", get("mount", "bf16", L, "ckptfs-comp", N, "cold_seq_mbps"), sq)
    sumrow("cold read, stored vs native ext4", get("mount", "bf16", L, "ckptfs-plain", N, "cold_seq_mbps"), nat)
    sumrow("cold read, compressed+encrypted vs native ext4", get("mount", "bf16", L, "ckptfs-both", N, "cold_seq_mbps"), nat)
    sumrow("warm re-read, compressed+encrypted vs native ext4", get("mount", "bf16", L, "ckptfs-both", N, "warm_seq_mbps"), get("mount", "bf16", L, "native", "-", "warm_seq_mbps"))
    sumrow("cold read, encrypted vs gocryptfs", get("mount", "bf16", L, "ckptfs-enc", N, "cold_seq_mbps"), gc)
    sumrow("cold read, compressed+encrypted vs gocryptfs", get("mount", "bf16", L, "ckptfs-both", N, "cold_seq_mbps"), gc)
    sumrow("warm re-read, compressed+encrypted vs gocryptfs", get("mount", "bf16", L, "ckptfs-both", N, "warm_seq_mbps"), get("mount", "bf16", L, "gocryptfs", "-", "warm_seq_mbps"))
    wn = get("write", "bf16", L, "native", "-", "done_mbps")
    wg = get("write", "bf16", L, "gocryptfs", "-", "done_mbps")
    sumrow("write: cp -r returns vs native cp -r + sync", get("write", "bf16", L, "ckptfs", N, "cp_mbps"), wn)
    sumrow("write: cp -r + packing vs native cp -r + sync", get("write", "bf16", L, "ckptfs", N, "done_mbps"), wn)
    sumrow("write with key: cp -r returns vs gocryptfs cp -r returns", get("write", "bf16", L, "ckptfs-key", N, "cp_mbps"), get("write", "bf16", L, "gocryptfs", "-", "cp_mbps"))
    sumrow("write with key: cp -r + packing vs gocryptfs cp -r + sync", get("write", "bf16", L, "ckptfs-key", N, "done_mbps"), wg)
    sumrow("`ckpt pack` (compressed) vs mksquashfs -comp gzip -b 1M", get("pack", "bf16", L, "ckpt-compressed", N, "pack_mbps"), get("pack", "bf16", L, "mksquashfs", N, "pack_mbps"))
    sumrow("`ckpt unpack` (compressed) vs unsquashfs", get("pack", "bf16", L, "ckpt-compressed", N, "unpack_mbps"), get("pack", "bf16", L, "mksquashfs", N, "unpack_mbps"))
    for (d = 1; d <= nd; d++)
        printf "| compression ratio, %s (%s) vs mksquashfs | %.3f | %.3f | %s |\n", dlab[d], fmt_size(dbyt[d]),
            get("pack", dlab[d], dbyt[d], "ckpt-compressed", N, "ratio"), get("pack", dlab[d], dbyt[d], "mksquashfs", N, "ratio"),
            rat(get("pack", dlab[d], dbyt[d], "ckpt-compressed", N, "ratio"), get("pack", dlab[d], dbyt[d], "mksquashfs", N, "ratio"))
    print ""
    print "Peak RSS in MiB (VmHWM of the daemon for mounts, of the process for pack and unpack); a ratio below 1 means ckptfs uses less."
    print ""
    print "| comparison | ckptfs | peer | ckptfs / peer |"
    print "|---|---|---|---|"
    rr = ckptfs_read_rss(L, N)
    sumrow("read daemon vs squashfuse", rr, get("mount", "bf16", L, "squashfuse", "-", "rss_kib"), "MiB")
    sumrow("read daemon vs gocryptfs", rr, get("mount", "bf16", L, "gocryptfs", "-", "rss_kib"), "MiB")
    sumrow("write daemon (with key) vs gocryptfs", get("write", "bf16", L, "ckptfs-key", N, "rss_kib"), get("write", "bf16", L, "gocryptfs", "-", "rss_kib"), "MiB")
    sumrow("`ckpt pack` vs mksquashfs", get("pack", "bf16", L, "ckpt-compressed", N, "pack_rss_kib"), get("pack", "bf16", L, "mksquashfs", N, "pack_rss_kib"), "MiB")
    sumrow("`ckpt unpack` vs unsquashfs", get("pack", "bf16", L, "ckpt-compressed", N, "unpack_rss_kib"), get("pack", "bf16", L, "mksquashfs", N, "unpack_rss_kib"), "MiB")
    print ""

    # ------------------------------------------------------ per size
    for (s = ns; s >= 1; s--) {
        by = sbyt[s]
        printf "## %s bf16 checkpoint (%s), %d threads\n\n", slab[s], fmt_size(by), N
        print "**Read** through each file system: `cat` of every tensor file after dropping the page cache (cold) and again (warm), and random 4 KiB reads through `mmap` over the largest tensor, in MB/s; ratios are of the cold sequential read."
        print ""
        print "| system | cold seq | warm seq | cold random 4K | warm random 4K | cold x native | cold x squashfuse | cold x gocryptfs | daemon peak RSS MiB |"
        print "|---|---|---|---|---|---|---|---|---|"
        nat = get("mount", "bf16", by, "native", "-", "cold_seq_mbps")
        sq = get("mount", "bf16", by, "squashfuse", "-", "cold_seq_mbps")
        gc = get("mount", "bf16", by, "gocryptfs", "-", "cold_seq_mbps")
        nsys = split("native squashfuse gocryptfs ckptfs-plain ckptfs-comp ckptfs-enc ckptfs-both", sys, " ")
        for (i = 1; i <= nsys; i++) {
            th = sys[i] ~ /^ckptfs/ ? N : "-"
            c = get("mount", "bf16", by, sys[i], th, "cold_seq_mbps")
            if (c == "") continue
            name = sys[i] ~ /^ckptfs/ ? modename[substr(sys[i], 8)] : sys[i] == "native" ? "native ext4" : sys[i]
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, f1(c),
                f1(get("mount", "bf16", by, sys[i], th, "warm_seq_mbps")),
                f1(get("mount", "bf16", by, sys[i], th, "cold_rand_mbps")),
                f1(get("mount", "bf16", by, sys[i], th, "warm_rand_mbps")),
                rat(c, nat), rat(c, sq), rat(c, gc), mib(get("mount", "bf16", by, sys[i], th, "rss_kib"))
        }
        print ""
        print "**Write**: `cp -r` of the checkpoint (warm in the page cache) into each file system; \"durable\" adds `sync` (native, gocryptfs) or `ckpt commit --wait` (ckptfs: packed and fsynced). MB/s; ratios are of the durable figure."
        print ""
        print "| system | cp -r returns MB/s | durable MB/s | durable s | x native | x gocryptfs | daemon peak RSS MiB |"
        print "|---|---|---|---|---|---|---|"
        wn = get("write", "bf16", by, "native", "-", "done_mbps")
        wg = get("write", "bf16", by, "gocryptfs", "-", "done_mbps")
        nsys = split("native gocryptfs ckptfs ckptfs-key", sys, " ")
        for (i = 1; i <= nsys; i++) {
            th = sys[i] ~ /^ckptfs/ ? N : "-"
            c = get("write", "bf16", by, sys[i], th, "done_mbps")
            if (c == "") continue
            name = sys[i] == "native" ? "native ext4" : sys[i] == "ckptfs-key" ? "ckptfs with key" : sys[i]
            printf "| %s | %s | %s | %s | %s | %s | %s |\n", name, f1(get("write", "bf16", by, sys[i], th, "cp_mbps")),
                f1(c), get("write", "bf16", by, sys[i], th, "done_s"), rat(c, wn), rat(c, wg),
                mib(get("write", "bf16", by, sys[i], th, "rss_kib"))
        }
        print ""
        print "**Pack and unpack** (`ckpt pack`/`unpack` vs `mksquashfs -comp gzip -b 1M`/`unsquashfs`), source in the page cache, MB/s of checkpoint."
        print ""
        print "| method | compression ratio | pack MB/s | unpack MB/s | pack x mksquashfs | ratio x mksquashfs | pack peak RSS MiB | unpack peak RSS MiB |"
        print "|---|---|---|---|---|---|---|---|"
        mp = get("pack", "bf16", by, "mksquashfs", N, "pack_mbps")
        mr = get("pack", "bf16", by, "mksquashfs", N, "ratio")
        nsys = split("ckpt-compressed ckpt-encrypted ckpt-stored mksquashfs", sys, " ")
        for (i = 1; i <= nsys; i++) {
            c = get("pack", "bf16", by, sys[i], N, "pack_mbps")
            if (c == "") continue
            r = get("pack", "bf16", by, sys[i], N, "ratio")
            printf "| %s | %.3f | %s | %s | %s | %s | %s | %s |\n", sys[i] == "mksquashfs" ? "mksquashfs gzip -b 1M" : "ckpt pack " (sys[i] == "ckpt-encrypted" ? "compressed+encrypted" : substr(sys[i], 6)),
                r, f1(c), f1(get("pack", "bf16", by, sys[i], N, "unpack_mbps")), rat(c, mp), rat(r, mr),
                mib(get("pack", "bf16", by, sys[i], N, "pack_rss_kib")), mib(get("pack", "bf16", by, sys[i], N, "unpack_rss_kib"))
        }
        print ""
    }

    # --------------------------------------------------- thread scaling
    sb = scale_by
    printf "## Thread scaling: %s bf16 checkpoint (%s)\n\n", scale_lab, fmt_size(sb)
    print "`ckpt pack --threads N`, `mksquashfs -processors N`, `ckptfs -o threads=N` (decode and packing workers), MB/s; ckptfs write is `cp -r` until committed. squashfuse, gocryptfs and native ext4 have no such setting: their figure is the same on every row."
    print ""
    over = 0
    for (i = 1; i <= nt; i++)
        if (tl[i] + 0 > N + 0)
            over = 1
    if (over)
        printf "This machine has %d cores: thread counts above %d oversubscribe them (more threads than cores compete for the same cores), and are measured so that the panel has four points; they show the cost of oversubscribing, not more parallelism.\n\n", N, N
    if (nt < 4)
        printf "Only %d thread count%s measured (`--threads` chose them); the default (`scale`) measures at least four.\n\n", nt, nt == 1 ? " was" : "s were"
    print "| threads | ckpt pack compressed | ckpt pack compressed+encrypted | mksquashfs | ckpt unpack compressed | unsquashfs | ckptfs cold read stored | compressed | encrypted | compressed+encrypted | ckptfs write | ckptfs write with key | native | squashfuse | gocryptfs |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    tdat = datdir "/threads.dat"
    print "# threads pack_comp pack_enc pack_stored mksquashfs read_plain read_comp read_enc read_both native squashfuse gocryptfs" > tdat
    for (i = 1; i <= nt; i++) {
        t = tl[i]
        printf "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t,
            f1(get("pack", "bf16", sb, "ckpt-compressed", t, "pack_mbps")), f1(get("pack", "bf16", sb, "ckpt-encrypted", t, "pack_mbps")),
            f1(get("pack", "bf16", sb, "mksquashfs", t, "pack_mbps")),
            f1(get("pack", "bf16", sb, "ckpt-compressed", t, "unpack_mbps")), f1(get("pack", "bf16", sb, "mksquashfs", t, "unpack_mbps")),
            f1(get("mount", "bf16", sb, "ckptfs-plain", t, "cold_seq_mbps")), f1(get("mount", "bf16", sb, "ckptfs-comp", t, "cold_seq_mbps")),
            f1(get("mount", "bf16", sb, "ckptfs-enc", t, "cold_seq_mbps")), f1(get("mount", "bf16", sb, "ckptfs-both", t, "cold_seq_mbps")),
            f1(get("write", "bf16", sb, "ckptfs", t, "done_mbps")), f1(get("write", "bf16", sb, "ckptfs-key", t, "done_mbps")),
            f1(get("mount", "bf16", sb, "native", "-", "cold_seq_mbps")), f1(get("mount", "bf16", sb, "squashfuse", "-", "cold_seq_mbps")),
            f1(get("mount", "bf16", sb, "gocryptfs", "-", "cold_seq_mbps"))
        printf "%d %s %s %s %s %s %s %s %s %s %s %s\n", t,
            num(get("pack", "bf16", sb, "ckpt-compressed", t, "pack_mbps")), num(get("pack", "bf16", sb, "ckpt-encrypted", t, "pack_mbps")),
            num(get("pack", "bf16", sb, "ckpt-stored", t, "pack_mbps")), num(get("pack", "bf16", sb, "mksquashfs", t, "pack_mbps")),
            num(get("mount", "bf16", sb, "ckptfs-plain", t, "cold_seq_mbps")), num(get("mount", "bf16", sb, "ckptfs-comp", t, "cold_seq_mbps")),
            num(get("mount", "bf16", sb, "ckptfs-enc", t, "cold_seq_mbps")), num(get("mount", "bf16", sb, "ckptfs-both", t, "cold_seq_mbps")),
            num(get("mount", "bf16", sb, "native", "-", "cold_seq_mbps")), num(get("mount", "bf16", sb, "squashfuse", "-", "cold_seq_mbps")),
            num(get("mount", "bf16", sb, "gocryptfs", "-", "cold_seq_mbps")) > tdat
    }
    close(tdat)
    print ""

    # ----------------------------------------------------- size scaling
    printf "## Size scaling: bf16 checkpoints, %d threads\n\n", N
    print "MB/s; a flat row means the cost grows linearly with the size. Write figures are until durable."
    print ""
    print "| size | ckpt pack | mksquashfs | ckptfs cold read (compressed+encrypted) | native cold read | squashfuse cold read | gocryptfs cold read | ckptfs write | ckptfs write with key | native write | gocryptfs write |"
    print "|---|---|---|---|---|---|---|---|---|---|---|"
    for (s = 1; s <= ns; s++) {
        by = sbyt[s]
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", fmt_size(by),
            f1(get("pack", "bf16", by, "ckpt-compressed", N, "pack_mbps")), f1(get("pack", "bf16", by, "mksquashfs", N, "pack_mbps")),
            f1(get("mount", "bf16", by, "ckptfs-both", N, "cold_seq_mbps")), f1(get("mount", "bf16", by, "native", "-", "cold_seq_mbps")),
            f1(get("mount", "bf16", by, "squashfuse", "-", "cold_seq_mbps")), f1(get("mount", "bf16", by, "gocryptfs", "-", "cold_seq_mbps")),
            f1(get("write", "bf16", by, "ckptfs", N, "done_mbps")), f1(get("write", "bf16", by, "ckptfs-key", N, "done_mbps")),
            f1(get("write", "bf16", by, "native", "-", "done_mbps")), f1(get("write", "bf16", by, "gocryptfs", "-", "done_mbps"))
    }
    print ""
    print "Peak RSS, MiB:"
    print ""
    print "| size | ckptfs read daemon | ckptfs write daemon (key) | ckpt pack | ckpt unpack | squashfuse | gocryptfs read | gocryptfs write | mksquashfs | unsquashfs |"
    print "|---|---|---|---|---|---|---|---|---|---|"
    sdat = datdir "/sizes.dat"
    print "# mb read_native read_squashfuse read_gocryptfs read_plain read_comp read_enc read_both write_native write_gocryptfs write_ckptfs write_ckptfs_key pack_comp pack_enc mksquashfs rss_read rss_write rss_pack rss_mksquashfs rss_squashfuse rss_gocryptfs" > sdat
    for (s = 1; s <= ns; s++) {
        by = sbyt[s]
        rr = ckptfs_read_rss(by, N)
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", fmt_size(by), mib(rr),
            mib(get("write", "bf16", by, "ckptfs-key", N, "rss_kib")), mib(get("pack", "bf16", by, "ckpt-compressed", N, "pack_rss_kib")),
            mib(get("pack", "bf16", by, "ckpt-compressed", N, "unpack_rss_kib")), mib(get("mount", "bf16", by, "squashfuse", "-", "rss_kib")),
            mib(get("mount", "bf16", by, "gocryptfs", "-", "rss_kib")), mib(get("write", "bf16", by, "gocryptfs", "-", "rss_kib")),
            mib(get("pack", "bf16", by, "mksquashfs", N, "pack_rss_kib")), mib(get("pack", "bf16", by, "mksquashfs", N, "unpack_rss_kib"))
        printf "%.1f %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s\n", by / 1e6,
            num(get("mount", "bf16", by, "native", "-", "cold_seq_mbps")), num(get("mount", "bf16", by, "squashfuse", "-", "cold_seq_mbps")),
            num(get("mount", "bf16", by, "gocryptfs", "-", "cold_seq_mbps")), num(get("mount", "bf16", by, "ckptfs-plain", N, "cold_seq_mbps")),
            num(get("mount", "bf16", by, "ckptfs-comp", N, "cold_seq_mbps")), num(get("mount", "bf16", by, "ckptfs-enc", N, "cold_seq_mbps")),
            num(get("mount", "bf16", by, "ckptfs-both", N, "cold_seq_mbps")),
            num(get("write", "bf16", by, "native", "-", "done_mbps")), num(get("write", "bf16", by, "gocryptfs", "-", "done_mbps")),
            num(get("write", "bf16", by, "ckptfs", N, "done_mbps")), num(get("write", "bf16", by, "ckptfs-key", N, "done_mbps")),
            num(get("pack", "bf16", by, "ckpt-compressed", N, "pack_mbps")), num(get("pack", "bf16", by, "ckpt-encrypted", N, "pack_mbps")),
            num(get("pack", "bf16", by, "mksquashfs", N, "pack_mbps")),
            rr == "" ? "?" : rr / 1024, mibq(get("write", "bf16", by, "ckptfs-key", N, "rss_kib")),
            mibq(get("pack", "bf16", by, "ckpt-compressed", N, "pack_rss_kib")), mibq(get("pack", "bf16", by, "mksquashfs", N, "pack_rss_kib")),
            mibq(get("mount", "bf16", by, "squashfuse", "-", "rss_kib")), mibq(get("mount", "bf16", by, "gocryptfs", "-", "rss_kib")) > sdat
    }
    close(sdat)
    print ""

    # ------------------------------------------------------ by dtype
    print "## Compression by dtype"
    print ""
    print "Compression ratio (logical / stored bytes) of the whole checkpoint, and pack MB/s at " N " threads."
    print ""
    print "| dtype | size | ckpt pack ratio | mksquashfs ratio | ckpt / mksquashfs | ckpt pack MB/s | mksquashfs MB/s |"
    print "|---|---|---|---|---|---|---|"
    ddat = datdir "/dtypes.dat"
    print "# dtype ckpt mksquashfs" > ddat
    for (d = 1; d <= nd; d++) {
        by = dbyt[d]
        a = get("pack", dlab[d], by, "ckpt-compressed", N, "ratio")
        b = get("pack", dlab[d], by, "mksquashfs", N, "ratio")
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", dlab[d], fmt_size(by), a == "" ? "-" : sprintf("%.3f", a),
            b == "" ? "-" : sprintf("%.3f", b), rat(a, b), f1(get("pack", dlab[d], by, "ckpt-compressed", N, "pack_mbps")),
            f1(get("pack", dlab[d], by, "mksquashfs", N, "pack_mbps"))
        printf "%s %s %s\n", dlab[d], num(a), num(b) > ddat
    }
    close(ddat)
    print ""
}
function mibq(kib) { return kib == "" ? "?" : sprintf("%.1f", kib / 1024) }
