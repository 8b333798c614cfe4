#!/usr/bin/env bash
# Packaging (packaging/): `make install` and `make uninstall` into a scratch
# root, the pkg-config file and programs built against the installed
# library, the man pages, the Debian packages (built, listed, extracted), and,
# as root, the real thing: a `make install` with the mount helper in /sbin,
# then the packages installed with dpkg, mounting through mount(8) by type
# and by an fstab line, and everything removed again.
#
# What this touches outside $TMP, only as root and only while holding
# /run/lock/ckptfs-test-packaging.lock: /sbin/mount.ckptfs and
# /sbin/mount.fuse.ckptfs, the packages ckptfs, libckpt0, libckpt-dev and
# python3-ckptfs,
# and the linker cache. The EXIT trap unmounts, purges and removes whatever
# this run put there; it refuses to start on a machine where any of it was
# there before.
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"

if [ ! -x "$CKPT" ] || [ ! -x "$CKPT_GEN" ] || [ ! -x "$BUILD/bin/ckptfs" ]; then
    fail "binaries built" "$BUILD/bin has no ckpt, ckpt-gen or ckptfs; run make first"
    finish
fi
VERSION=$("$CKPT" --version | awk '{print $2}')
PKGS=(ckptfs libckpt0 libckpt-dev python3-ckptfs)
MNT=$TMP/mnt
# What the EXIT trap undoes.
INSTALLED_HELPER=0
INSTALLED_PKGS=0

is_mounted() { awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/self/mounts; }

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup_all() {
    for _ in 1 2 3; do
        is_mounted "$MNT" || break
        umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
        sleep 0.2
    done
    if [ "$INSTALLED_PKGS" = 1 ]; then
        dpkg -P "${PKGS[@]}" >/dev/null 2>&1 || echo "cleanup: dpkg -P ${PKGS[*]} failed" >&2
    fi
    if [ "$INSTALLED_HELPER" = 1 ]; then
        make --no-print-directory -C "$ROOT" B="$B" PREFIX="$TMP/prefix" SYSCONFDIR="$TMP/prefix/etc" \
            DESTDIR= uninstall >/dev/null 2>&1 ||
            rm -f /sbin/mount.ckptfs /sbin/mount.fuse.ckptfs
    fi
    cleanup_tmp
}
trap cleanup_all EXIT
trap 'exit 130' INT TERM

mk() { run_cmd make --no-print-directory -C "$ROOT" B="$B" "$@"; }

# Every regular file and link under DIR, relative, sorted.
list_tree() { (cd "$1" && find . \( -type f -o -type l \) -printf '%P\n' | LC_ALL=C sort); }

# ------------------------------------------------------------ test inputs

cd "$TMP" || exit 1
"$CKPT_GEN" "$TMP/src" --preset tiny >/dev/null
"$CKPT" keygen -o "$TMP/key" >/dev/null
mkdir -p "$TMP/packs" "$MNT"
"$CKPT" pack "$TMP/src" -o "$TMP/plain.tpack" >/dev/null
"$CKPT" pack "$TMP/src" -o "$TMP/packs/m.tpack" --key-file "$TMP/key" >/dev/null
if [ ! -s "$TMP/plain.tpack" ] || [ ! -s "$TMP/packs/m.tpack" ] || [ ! -f "$TMP/src/config.json" ]; then
    fail "test packs made" "ckpt-gen or ckpt pack failed"
    finish
fi

# --------------------------------------------- make install into DESTDIR

D=$TMP/root
expected=(
    etc/ckptfs/example.conf
    sbin/mount.ckptfs
    sbin/mount.fuse.ckptfs
    usr/bin/ckpt
    usr/bin/ckptfs
    usr/include/ckpt.h
    usr/include/ckpt_mount.h
    usr/include/ckpt_names.h
    usr/lib/libckpt.a
    usr/lib/libckpt.so
    usr/lib/libckpt.so.0
    "usr/lib/libckpt.so.$VERSION"
    usr/lib/pkgconfig/libckpt.pc
    usr/lib/python3/dist-packages/ckptfs/__init__.py
    usr/lib/python3/dist-packages/ckptfs/_checkpoint.py
    usr/lib/python3/dist-packages/ckptfs/_dtypes.py
    usr/lib/python3/dist-packages/ckptfs/_errors.py
    usr/lib/python3/dist-packages/ckptfs/_mount.py
    usr/lib/systemd/system/ckptfs@.service
    usr/share/man/man1/ckpt.1.gz
    usr/share/man/man5/tpack.5.gz
    usr/share/man/man8/ckptfs.8.gz
    usr/share/man/man8/mount.ckptfs.8.gz
    usr/share/man/man8/mount.fuse.ckptfs.8.gz
)
if [ -x "$BUILD/bin/ckpt-cuda" ]; then
    expected+=(usr/bin/ckpt-cuda usr/share/man/man1/ckpt-cuda.1.gz)
fi

mk install DESTDIR="$D" PREFIX=/usr
if [ "$LAST_RC" -eq 0 ]; then pass "make install DESTDIR PREFIX=/usr"; else fail "make install DESTDIR PREFIX=/usr"; show_last make install; fi
if d=$(diff <(printf '%s\n' "${expected[@]}" | LC_ALL=C sort) <(list_tree "$D")); then
    pass "install puts exactly the expected ${#expected[@]} files in place"
else
    fail "install puts exactly the expected ${#expected[@]} files in place" "< expected, > installed:"
    printf '%s\n' "$d" | sed -n '1,12s/^/     /p'
fi
if [ "$(readlink "$D/usr/lib/libckpt.so")" = libckpt.so.0 ] &&
    [ "$(readlink "$D/usr/lib/libckpt.so.0")" = "libckpt.so.$VERSION" ] &&
    [ ! -L "$D/usr/lib/libckpt.so.$VERSION" ]; then
    pass "libckpt.so -> libckpt.so.0 -> libckpt.so.$VERSION"
else
    fail "libckpt.so -> libckpt.so.0 -> libckpt.so.$VERSION" "$(ls -l "$D"/usr/lib/libckpt.so* 2>&1)"
fi
soname=$(readelf -d "$D/usr/lib/libckpt.so.$VERSION" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" = libckpt.so.0 ]; then pass "the installed library's soname is libckpt.so.0"; else fail "the installed library's soname is libckpt.so.0" "soname: '$soname'"; fi
modes=$(stat -c '%a %n' "$D/usr/bin/ckpt" "$D/usr/bin/ckptfs" "$D/sbin/mount.ckptfs" \
    "$D/usr/include/ckpt.h" "$D/usr/lib/libckpt.a" "$D/usr/share/man/man8/ckptfs.8.gz" | cut -d' ' -f1 | tr '\n' ' ')
if [ "$modes" = "755 755 755 644 644 644 " ]; then pass "installed modes"; else fail "installed modes" "got: $modes"; fi
if grep -rl '@[A-Z_]*@' "$D/sbin" "$D/usr/lib/pkgconfig" "$D/usr/lib/systemd" >/dev/null 2>&1; then
    fail "no template placeholder left" "$(grep -rl '@[A-Z_]*@' "$D/sbin" "$D/usr/lib/pkgconfig" "$D/usr/lib/systemd")"
else
    pass "no template placeholder left"
fi
if grep -qx "BINDIR='/usr/bin'" "$D/sbin/mount.ckptfs" &&
    grep -q '^ExecStart=/usr/bin/ckptfs -f ' "$D/usr/lib/systemd/system/ckptfs@.service"; then
    pass "helper and unit name the installed binaries"
else
    fail "helper and unit name the installed binaries"
fi
if command -v shellcheck >/dev/null; then
    expect_ok "the installed mount helper is shellcheck-clean" shellcheck "$D/sbin/mount.ckptfs"
fi
# What an administrator copies to /etc/ckptfs/NAME.conf: its mount must be
# root's alone unless they add allow_other (which shows the decrypted
# checkpoints to every user the modes let in).
example_options=$(. "$D/etc/ckptfs/example.conf" && printf '%s' "${OPTIONS-}")
case ,$example_options, in
*,allow_other,* | *,allow_root,*) fail "example.conf's mount is private to root" "OPTIONS=$example_options" ;;
*) pass "example.conf's mount is private to root" ;;
esac
expect_ok "the installed ckpt runs" "$D/usr/bin/ckpt" --version
last_stdout_has "the installed ckpt is this version" "ckpt $VERSION"

# ------------------------------- the unit's start and stop, as systemd does

# No systemd here: the installed unit's ExecStart= runs with an instance's
# variables (each ${VAR} one word, as systemd substitutes it), and stopping
# does what `systemctl stop` does: each ExecStop= command, then SIGTERM to
# the main process if it is still there. With finish_on_exit, the pack under
# way must be finished, not killed half written.
unit=$D/usr/lib/systemd/system/ckptfs@.service
# unit_words LINE: a command line of the unit as the words systemd runs, in
# UNIT_WORDS: the installed binaries taken from $D, ${VAR} from this shell.
unit_words() {
    local w v raw
    UNIT_WORDS=()
    read -ra raw <<<"$1"
    for w in "${raw[@]}"; do
        case $w in
        \$\{*\}) v=${w:2:${#w}-3}; UNIT_WORDS+=("${!v}") ;;
        /usr/bin/*) UNIT_WORDS+=("$D$w") ;;
        *) UNIT_WORDS+=("$w") ;;
        esac
    done
}
if [ -c /dev/fuse ] && [ "$(id -u)" -eq 0 ] && command -v fusermount3 >/dev/null; then
    mkdir -p "$TMP/unit/back" "$TMP/unit/mnt"
    head -c $((256 << 20)) /dev/urandom >"$TMP/unit/big.bin"
    BACKING=$TMP/unit/back MOUNT=$TMP/unit/mnt OPTIONS=key_file=$TMP/key,commit_delay=0,threads=1,finish_on_exit
    unit_words "$(sed -n 's/^ExecStart=//p' "$unit")"
    "${UNIT_WORDS[@]}" 2>"$TMP/unit/log" &
    unit_pid=$!
    for _ in $(seq 200); do mountpoint -q "$MOUNT" && break; sleep 0.05; done
    if mountpoint -q "$MOUNT" && mkdir "$MOUNT/big" && cp "$TMP/unit/big.bin" "$MOUNT/big/" &&
        "$CKPT" commit "$MOUNT/big" >/dev/null; then
        for _ in $(seq 200); do
            read -r done_bytes _ < <(getfattr --only-values -n user.ckptfs.progress "$MOUNT/big" 2>/dev/null)
            [ "${done_bytes:-0}" -gt 0 ] && break
            sleep 0.02
        done
        while read -r stop_line; do
            unit_words "$stop_line"
            "${UNIT_WORDS[@]}"
            # systemd's SIGTERM follows at once, by when ckptfs may have seen
            # the unmount and be finishing (made certain here, not a race).
            for _ in $(seq 100); do grep -q "was unmounted" "$TMP/unit/log" && break; sleep 0.05; done
        done < <(sed -n 's/^ExecStop=//p' "$unit")
        kill -TERM "$unit_pid" 2>/dev/null
        wait "$unit_pid"
        rc=$?
        if [ "$rc" -eq 0 ]; then pass "the unit's stop: ckptfs exits 0"; else fail "the unit's stop: ckptfs exits 0" "status $rc; $(tail -n 3 "$TMP/unit/log")"; fi
        if "$CKPT" verify "$BACKING/big.tpack" --key-file "$TMP/key" >/dev/null 2>&1; then
            pass "the unit's stop with finish_on_exit: the pack under way is finished"
        else
            fail "the unit's stop with finish_on_exit: the pack under way is finished" "$(ls -a "$BACKING" | tr '\n' ' ')"
        fi
    else
        fail "the unit's ExecStart mounts, and a checkpoint is written" "$(tail -n 5 "$TMP/unit/log")"
        kill -TERM "$unit_pid" 2>/dev/null
        wait "$unit_pid"
    fi
    is_mounted "$MOUNT" && fusermount3 -u -z "$MOUNT"
    rm -rf "$TMP/unit"
else
    skip "the unit's start and stop" "needs root, /dev/fuse and fusermount3"
fi

# ------------------------------------------- pkg-config and linking to it

export PKG_CONFIG_PATH=$D/usr/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D
expect_ok "pkg-config --modversion libckpt" pkg-config --modversion libckpt
last_stdout_has "pkg-config gives the version" "$VERSION"
expect_ok "pkg-config --cflags --libs libckpt" pkg-config --cflags --libs libckpt
last_stdout_has "pkg-config points into DESTDIR" "-I$D/usr/include" "-L$D/usr/lib" "-lckpt"
expect_ok "pkg-config --static --libs libckpt" pkg-config --static --libs libckpt
last_stdout_has "pkg-config --static names the private libraries" "-lsodium" "-ldeflate" "-lz" "-ljansson" "-lcrypto"

cat >"$TMP/t.c" <<'EOF'
/* Prints one file of an unencrypted pack, through the installed libckpt. */
#include <ckpt.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    ckpt_err err = {0};
    ckpt_pack *p = NULL;
    if (argc != 3) {
        fprintf(stderr, "usage: %s PACK PATH\n", argv[0]);
        return 2;
    }
    if (ckpt_open(argv[1], NULL, &p, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    long i = ckpt_file_find(p, argv[2]);
    const ckpt_file_info *f = i < 0 ? NULL : ckpt_file_at(p, (size_t)i);
    char *buf = f ? malloc(f->size + 1) : NULL;
    ssize_t n = buf ? ckpt_file_pread(p, (size_t)i, buf, f->size, 0, &err) : -1;
    int ok = f && n == (ssize_t)f->size && fwrite(buf, 1, f->size, stdout) == f->size;
    if (!ok)
        fprintf(stderr, "cannot read %s: %s\n", argv[2], err.msg[0] ? err.msg : "not found");
    fprintf(stderr, "libckpt %s: %zu files, %zu tensors\n", CKPT_VERSION_STRING,
            ckpt_file_count(p), ckpt_tensor_count(p));
    free(buf);
    ckpt_close(p);
    return ok ? 0 : 1;
}
EOF
# Word splitting of pkg-config's output is intended.
# shellcheck disable=SC2046
expect_ok "a program compiles and links against the installed libckpt.so" \
    cc -std=c11 -Wall -Wextra -Werror -o "$TMP/t" "$TMP/t.c" $(pkg-config --cflags --libs libckpt)
if readelf -d "$TMP/t" 2>/dev/null | grep -q 'NEEDED.*\[libckpt\.so\.0\]'; then
    pass "the program needs libckpt.so.0"
else
    fail "the program needs libckpt.so.0"
fi
LD_LIBRARY_PATH=$D/usr/lib run_cmd "$TMP/t" "$TMP/plain.tpack" config.json
if [ "$LAST_RC" -eq 0 ] && cmp -s "$LAST_OUT" "$TMP/src/config.json"; then
    pass "it opens a pack and reads a file through the installed library"
else
    fail "it opens a pack and reads a file through the installed library"
    show_last "$TMP/t" "$TMP/plain.tpack" config.json
fi
last_stderr_has "it sees the pack's files and tensors" "libckpt $VERSION: 2 files"
LD_LIBRARY_PATH=$D/usr/lib run_cmd ldd "$TMP/t"
last_stdout_has "the dynamic loader picks the installed library" "$D/usr/lib/libckpt.so.0"
static_libs=$(pkg-config --static --libs libckpt | sed 's/-lckpt\b//')
# shellcheck disable=SC2046,SC2086
expect_ok "a program links statically against the installed libckpt.a" \
    cc -std=c11 -Wall -Werror -o "$TMP/t_static" "$TMP/t.c" $(pkg-config --cflags libckpt) \
    -Wl,-Bstatic -lckpt -Wl,-Bdynamic $static_libs
if readelf -d "$TMP/t_static" 2>/dev/null | grep -q 'libckpt'; then
    fail "the static program does not need libckpt.so"
else
    pass "the static program does not need libckpt.so"
fi
run_cmd env -u LD_LIBRARY_PATH "$TMP/t_static" "$TMP/plain.tpack" config.json
if [ "$LAST_RC" -eq 0 ] && cmp -s "$LAST_OUT" "$TMP/src/config.json"; then
    pass "the static program reads the pack"
else
    fail "the static program reads the pack"
    show_last "$TMP/t_static"
fi
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR

# ----------------------------------------------- configuration is kept

echo "# changed by the administrator" >>"$D/etc/ckptfs/example.conf"
mk install DESTDIR="$D" PREFIX=/usr
if [ "$LAST_RC" -eq 0 ] && grep -q 'changed by the administrator' "$D/etc/ckptfs/example.conf"; then
    pass "install again keeps a changed example.conf"
else
    fail "install again keeps a changed example.conf"
    show_last make install
fi
mk uninstall DESTDIR="$D" PREFIX=/usr
if [ "$LAST_RC" -eq 0 ] && [ "$(list_tree "$D")" = etc/ckptfs/example.conf ]; then
    pass "uninstall removes everything but the changed example.conf"
else
    fail "uninstall removes everything but the changed example.conf" "left: $(list_tree "$D" | tr '\n' ' ')"
fi
rm -f "$D/etc/ckptfs/example.conf"

# ------------------------------------------------ install, then uninstall

rm -rf "$D"
mk install DESTDIR="$D" PREFIX=/usr
mk uninstall DESTDIR="$D" PREFIX=/usr
if [ "$LAST_RC" -eq 0 ] && [ -z "$(list_tree "$D")" ]; then
    pass "make uninstall with the same DESTDIR leaves no files"
else
    fail "make uninstall with the same DESTDIR leaves no files" "left: $(list_tree "$D" | tr '\n' ' ')"
fi
expect_absent "uninstall removes /etc/ckptfs when it is empty" "$D/etc/ckptfs"

# ------------------------------------------------------------- man pages

for page in "$ROOT"/packaging/man/*.[158]; do
    name=$(basename "$page")
    run_cmd man --warnings -E UTF-8 -l "$page"
    if [ "$LAST_RC" -eq 0 ] && [ ! -s "$LAST_ERR" ] && [ -s "$LAST_OUT" ]; then
        pass "man $name renders without warnings"
    else
        fail "man $name renders without warnings"
        show_last man --warnings -l "$page"
    fi
    if command -v mandoc >/dev/null; then
        run_cmd mandoc -T lint -W warning "$page"
        if [ "$LAST_RC" -eq 0 ] && [ ! -s "$LAST_OUT" ] && [ ! -s "$LAST_ERR" ]; then
            pass "mandoc -T lint $name"
        else
            fail "mandoc -T lint $name" "$(cat "$LAST_OUT" "$LAST_ERR" | head -n 5)"
        fi
    fi
done
command -v mandoc >/dev/null || skip "mandoc -T lint" "mandoc is not installed"

# The pages must keep up with the binaries: every ckptfs -o option, every
# ckpt command and every option of each command is documented.
missing=()
for o in $("$BUILD/bin/ckptfs" --help | sed -n 's/^ *-o \([a-z_]*\)=.*/\1/p'); do
    grep -qF "$o=" "$ROOT/packaging/man/ckptfs.8" || missing+=("ckptfs -o $o")
done
for c in $("$CKPT" --help | sed -n '/^commands:/,/^$/s/^  \([a-z]*\) .*/\1/p'); do
    grep -q "^\.SS ckpt $c\b" "$ROOT/packaging/man/ckpt.1" || missing+=("ckpt $c")
    for o in $("$CKPT" "$c" --help | grep -oE -- '--[a-z][a-z-]*' | sort -u); do
        grep -qF -- "${o//-/\\-}" "$ROOT/packaging/man/ckpt.1" || missing+=("ckpt $c $o")
    done
done
if [ ${#missing[@]} -eq 0 ]; then
    pass "the man pages document every command and option of --help"
else
    fail "the man pages document every command and option of --help" "undocumented: ${missing[*]}"
fi

# ----------------------------------------------------- Debian packages

deb_dir=$BUILD/deb
have_tools=1
for t in dpkg-buildpackage dh fakeroot; do command -v "$t" >/dev/null || have_tools=0; done
if [ "$have_tools" = 0 ] && [ "$(id -u)" -ne 0 ]; then
    skip "Debian packages" "dpkg-dev, debhelper or fakeroot is missing, and only root can install them"
    finish
fi
B=$B DEB_BUILD_OPTIONS=nocheck run_cmd "$ROOT/packaging/build-deb.sh"
if [ "$LAST_RC" -ne 0 ]; then
    fail "packaging/build-deb.sh builds the packages"
    show_last packaging/build-deb.sh
    finish
fi
pass "packaging/build-deb.sh builds the packages"
debs=()
for p in "${PKGS[@]}"; do
    arch=$(dpkg --print-architecture)
    [ "$p" = python3-ckptfs ] && arch=all
    debs+=("$deb_dir/${p}_${VERSION}_$arch.deb")
done
for f in "${debs[@]}"; do
    [ -f "$f" ] || { fail "the .deb files are in $deb_dir" "$f is missing"; finish; }
done
pass "the .deb files are in $deb_dir"

# Lists: path per line, "./" dropped, links without their targets.
deb_list() { dpkg-deb -c "$1" | awk '{ p = $6; sub(/^\.\//, "", p); print p }'; }
check_deb_lists() {
    local deb=$1 f missing_files=()
    shift
    for f in "$@"; do deb_list "$deb" | grep -qx "$f" || missing_files+=("$f"); done
    if [ ${#missing_files[@]} -eq 0 ]; then
        pass "dpkg-deb -c $(basename "$deb") lists $*"
    else
        fail "dpkg-deb -c $(basename "$deb") lists what it should" "missing: ${missing_files[*]}"
    fi
}
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
check_deb_lists "${debs[0]}" usr/bin/ckpt usr/bin/ckptfs sbin/mount.ckptfs sbin/mount.fuse.ckptfs \
    lib/systemd/system/ckptfs@.service etc/ckptfs/example.conf usr/share/man/man1/ckpt.1.gz \
    usr/share/man/man5/tpack.5.gz usr/share/man/man8/ckptfs.8.gz
check_deb_lists "${debs[1]}" "usr/lib/$ma/libckpt.so.$VERSION" "usr/lib/$ma/libckpt.so.0"
check_deb_lists "${debs[2]}" usr/include/ckpt.h usr/include/ckpt_mount.h usr/include/ckpt_names.h "usr/lib/$ma/libckpt.a" "usr/lib/$ma/libckpt.so" \
    "usr/lib/$ma/pkgconfig/libckpt.pc"
check_deb_lists "${debs[3]}" usr/lib/python3/dist-packages/ckptfs/__init__.py \
    usr/lib/python3/dist-packages/ckptfs/_checkpoint.py
if dpkg-deb -f "${debs[3]}" Depends | grep -qw python3-numpy; then pass "python3-ckptfs depends on python3-numpy"; else fail "python3-ckptfs depends on python3-numpy"; fi
if dpkg-deb -f "${debs[0]}" Depends | grep -qw fuse3; then pass "ckptfs depends on fuse3"; else fail "ckptfs depends on fuse3"; fi
run_cmd dpkg-deb --ctrl-tarfile "${debs[0]}"
if tar -xOf "$LAST_OUT" ./conffiles 2>/dev/null | grep -qx /etc/ckptfs/example.conf; then
    pass "example.conf is a conffile"
else
    fail "example.conf is a conffile"
fi

X=$TMP/extracted
for f in "${debs[@]}"; do dpkg-deb -x "$f" "$X"; done
expect_ok "the extracted ckpt runs" "$X/usr/bin/ckpt" --version
last_stdout_has "the extracted ckpt is this version" "ckpt $VERSION"
expect_ok "the extracted ckptfs runs" "$X/usr/bin/ckptfs" --version
last_stdout_has "the extracted ckptfs is this version" "ckptfs $VERSION"

# ------------------------------------------ the real thing, as root only

if [ "$(id -u)" -ne 0 ]; then
    skip "installing for real" "needs root"
    finish
fi
lock=/run/lock/ckptfs-test-packaging.lock
[ -d /run/lock ] || lock=/tmp/ckptfs-test-packaging.lock
if ! { exec 9>"$lock"; } 2>/dev/null || ! flock -w 600 9; then
    skip "installing for real" "cannot take $lock (another run holds it?)"
    finish
fi
for p in "${PKGS[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'installed'; then
        skip "installing for real" "the package $p is already installed here; not touching it"
        finish
    fi
done
if [ -e /sbin/mount.ckptfs ] || [ -L /sbin/mount.fuse.ckptfs ]; then
    skip "installing for real" "/sbin/mount.ckptfs is already there; not touching it"
    finish
fi
can_mount=1
if [ ! -c /dev/fuse ] || ! command -v fusermount3 >/dev/null || ! command -v mount.fuse3 >/dev/null; then
    can_mount=0
    skip "mounting through mount(8)" "no /dev/fuse, fusermount3 or mount.fuse3 here"
fi

# Mounts with mount ARGS..., reads a file through the mount, unmounts.
mount_read_umount() {
    local what=$1
    shift
    expect_ok "$what: mount" mount "$@"
    [ "$LAST_RC" -eq 0 ] || return 0
    expect_same_sha256 "$what: a file reads back through the mount" "$MNT/m/config.json" "$TMP/src/config.json"
    if awk -v m="$MNT" '$2 == m && $3 == "fuse.ckptfs" && $4 ~ /nosuid/ && $4 ~ /nodev/ { f = 1 } END { exit !f }' \
        /proc/self/mounts; then
        pass "$what: mounted as fuse.ckptfs, nosuid, nodev"
    else
        fail "$what: mounted as fuse.ckptfs, nosuid, nodev" "$(grep " $MNT " /proc/self/mounts)"
    fi
    expect_ok "$what: umount" umount "$MNT"
    if is_mounted "$MNT"; then fail "$what: nothing left mounted"; else pass "$what: nothing left mounted"; fi
}

# make install with a prefix of its own: the helper in /sbin must find
# ckptfs there, where mount.fuse3 alone (which has no PATH) would not.
P=$TMP/prefix
INSTALLED_HELPER=1
mk install PREFIX="$P" SYSCONFDIR="$P/etc" DESTDIR=
if [ "$LAST_RC" -eq 0 ] && [ -x /sbin/mount.ckptfs ] && [ "$(readlink /sbin/mount.fuse.ckptfs)" = mount.ckptfs ]; then
    pass "make install PREFIX=$P (no DESTDIR) puts the helper in /sbin"
else
    fail "make install PREFIX=$P (no DESTDIR) puts the helper in /sbin"
    show_last make install
fi
if [ "$can_mount" = 1 ]; then
    expect_ok "prefix install: mount -t fuse.ckptfs" mount -t fuse.ckptfs "$TMP/packs" "$MNT" -o "key_file=$TMP/key"
    daemon=$(pgrep -f -n -- "ckptfs $TMP/packs $MNT" || true)
    if [ -n "$daemon" ] && [ "$(readlink "/proc/$daemon/exe")" = "$P/bin/ckptfs" ]; then
        pass "prefix install: the daemon is $P/bin/ckptfs"
    else
        fail "prefix install: the daemon is $P/bin/ckptfs" "pid '${daemon}': $(readlink "/proc/${daemon:-0}/exe" 2>&1)"
    fi
    expect_same_sha256 "prefix install: a file reads back" "$MNT/m/config.json" "$TMP/src/config.json"
    expect_ok "prefix install: umount" umount "$MNT"
fi
mk uninstall PREFIX="$P" SYSCONFDIR="$P/etc" DESTDIR=
if [ "$LAST_RC" -eq 0 ] && [ -z "$(list_tree "$P")" ] && [ ! -e /sbin/mount.ckptfs ] && [ ! -L /sbin/mount.fuse.ckptfs ]; then
    INSTALLED_HELPER=0
    pass "make uninstall removes the prefix's files and the helper"
else
    fail "make uninstall removes the prefix's files and the helper" "left: $(list_tree "$P" | tr '\n' ' ')"
fi

# The packages.
INSTALLED_PKGS=1
expect_ok "dpkg -i ckptfs libckpt0 libckpt-dev python3-ckptfs" dpkg -i "${debs[@]}"
expect_ok "ckpt --version from PATH" ckpt --version
last_stdout_has "ckpt from PATH is the installed one" "ckpt $VERSION"
if [ "$(command -v ckpt)" = /usr/bin/ckpt ] && [ "$(command -v ckptfs)" = /usr/bin/ckptfs ]; then
    pass "ckpt and ckptfs are found in /usr/bin"
else
    fail "ckpt and ckptfs are found in /usr/bin" "ckpt: $(command -v ckpt), ckptfs: $(command -v ckptfs)"
fi
run_cmd bash -c 'cd / && /usr/bin/python3 -c "import ckptfs; print(ckptfs.__file__, ckptfs.__version__)"'
last_stdout_has "Debian's python3 imports the packaged ckptfs" "/usr/lib/python3/dist-packages/ckptfs/__init__.py $VERSION"
expect_ok "man finds ckptfs(8)" man -w 8 ckptfs
expect_ok "man finds mount.ckptfs(8)" man -w mount.ckptfs
expect_ok "pkg-config finds the packaged libckpt" pkg-config --exact-version="$VERSION" libckpt
# shellcheck disable=SC2046
expect_ok "a program builds against the packaged library" \
    cc -std=c11 -o "$TMP/t_pkg" "$TMP/t.c" $(pkg-config --cflags --libs libckpt)
run_cmd "$TMP/t_pkg" "$TMP/plain.tpack" config.json
if [ "$LAST_RC" -eq 0 ] && cmp -s "$LAST_OUT" "$TMP/src/config.json"; then
    pass "it runs with the packaged libckpt.so.0"
else
    fail "it runs with the packaged libckpt.so.0"
    show_last "$TMP/t_pkg"
fi
if command -v systemd-analyze >/dev/null; then
    mkdir -p "$TMP/units"
    cp /lib/systemd/system/ckptfs@.service "$TMP/units/ckptfs@mnt-ckpt.service"
    run_cmd systemd-analyze verify --man=no "$TMP/units/ckptfs@mnt-ckpt.service"
    if [ "$LAST_RC" -eq 0 ] && [ ! -s "$LAST_ERR" ]; then
        pass "systemd-analyze verify ckptfs@.service"
    else
        fail "systemd-analyze verify ckptfs@.service" "$(head -n 5 "$LAST_ERR")"
    fi
else
    skip "systemd-analyze verify ckptfs@.service" "systemd-analyze is not installed"
fi

if [ "$can_mount" = 1 ]; then
    mount_read_umount "mount -t fuse.ckptfs" -t fuse.ckptfs "$TMP/packs" "$MNT" -o "key_file=$TMP/key"
    mount_read_umount "mount -t ckptfs" -t ckptfs "$TMP/packs" "$MNT" -o "key_file=$TMP/key"
    if mount --help 2>&1 | grep -q -- '--fstab'; then
        printf '# test fstab\n%s %s fuse.ckptfs key_file=%s,nofail,noauto,_netdev 0 0\n' \
            "$TMP/packs" "$MNT" "$TMP/key" >"$TMP/fstab"
        mount_read_umount "an fstab line (mount --fstab)" --fstab "$TMP/fstab" "$MNT"
        printf '%s %s fuse.ckptfs key_file=%s,nofail 0 0\n' "$TMP/packs" "$MNT" "$TMP/no-such-key" \
            >"$TMP/fstab.bad"
        expect_fail "an fstab line with a missing key fails" mount --fstab "$TMP/fstab.bad" "$MNT"
        last_stderr_has "the failure names the key file" "cannot load key" "$TMP/no-such-key"
        if is_mounted "$MNT"; then fail "the failed mount leaves nothing mounted"; else pass "the failed mount leaves nothing mounted"; fi
        # mount -a, as at boot and after each edit of fstab, must leave a
        # line that is mounted alone: mounting it again fails.
        printf '%s %s fuse.ckptfs key_file=%s 0 0\n' "$TMP/packs" "$MNT" "$TMP/key" >"$TMP/fstab.auto"
        expect_ok "mount -a mounts an fstab line" mount --fstab "$TMP/fstab.auto" -a
        expect_ok "mount -a again sees that line mounted" mount --fstab "$TMP/fstab.auto" -a
        n=$(awk -v m="$MNT" '$2 == m' /proc/self/mounts | wc -l)
        if [ "$n" -eq 1 ]; then pass "mount -a twice: mounted once"; else fail "mount -a twice: mounted once" "$n mounts"; fi
        expect_ok "umount after mount -a" umount "$MNT"
    else
        skip "an fstab line" "this mount(8) has no --fstab"
    fi
fi

expect_ok "dpkg -P ckptfs libckpt0 libckpt-dev python3-ckptfs" dpkg -P "${PKGS[@]}"
[ "$LAST_RC" -eq 0 ] && INSTALLED_PKGS=0
expect_absent "purging removes the files" /usr/bin/ckpt /usr/bin/ckptfs /sbin/mount.ckptfs \
    /sbin/mount.fuse.ckptfs /etc/ckptfs/example.conf /lib/systemd/system/ckptfs@.service \
    "/usr/lib/$ma/libckpt.so.0" /usr/lib/python3/dist-packages/ckptfs

finish
