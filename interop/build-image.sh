#!/usr/bin/env bash
# Builds the siw interop VM image into $OUT (default /var/tmp/soft-rdma-siw; big, outside the repository):
#   vmlinuz         Debian bookworm's 6.1 kernel (ib_core, iw_cm, rdma_cm, ib_uverbs as modules; siw not
#                   built by Debian: CONFIG_RDMA_SIW is unset)
#   initramfs.gz    busybox, the RDMA modules, siw built out of tree from the same kernel's source (upstream as
#                   is, plus a copy whose compile-time protocol knobs are module parameters), rdma-core 44
#                   (libibverbs, librdmacm, the siw provider, rping, rdma_server/rdma_client), perftest 4.5,
#                   cm_peer, Python 3.11 with python3-pyverbs and rdma-core's own test suite (/sr/rdma-core-tests),
#                   libfabric 1.17 (libfabric1, libfabric-bin: fi_info, fi_pingpong) and qperf 0.4.11
#   image.stamp     the inputs this image was built from; a matching stamp skips the build
# Needs root (apt-get) and network access to Debian's mirror. Called by `cargo xtask interop`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/var/tmp/soft-rdma-siw}
export DEBIAN_FRONTEND=noninteractive
step() { echo "==> siw image: $*" >&2; }

host_pkgs=(qemu-system-x86 busybox-static cpio kmod xz-utils make gcc tshark librdmacm-dev libibverbs-dev)
missing=()
for p in "${host_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    apt-get update -qq || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$KPKG" ] || { apt-get update -qq; KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
KVER=${KPKG#linux-image-}
SERIES=$(echo "$KVER" | cut -d. -f1-2)
# perftest (ib_*_bw, ib_*_lat) links libpci.so.3 (which links libz.so.1 and libudev.so.1), and its Send tests
# libibumad.so.3; rdma-core's own test suite (python3-pyverbs) needs Python 3.11 and iproute2's `ip -j`, which
# links libbpf.so.1 and libelf.so.1; libfabric links libpsm2, libpsm_infinipath (an alternatives link that
# dpkg-deb -x does not make: made below), libinfinipath, libnuma and libatomic; tc links libxtables
USER_PKGS="libc6 libgcc-s1 libibverbs1 librdmacm1 ibverbs-providers rdmacm-utils ibverbs-utils
    libnl-3-200 libnl-route-3-200 iproute2 libmnl0 libbsd0 libmd0 libcap2 libxtables12
    perftest libpci3 zlib1g libudev1 libibumad3
    python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3-minimal libpython3.11 python3-pyverbs
    libexpat1 libffi8 libbz2-1.0 liblzma5 libuuid1 libcrypt1 libbpf1 libelf1
    libfabric1 libfabric-bin libpsm2-2 libpsm-infinipath1 libnuma1 libatomic1 qperf"
# C tests of tests/c that the siw suite runs in the VM (tests/tests/siw_middleware.rs)
VM_C_TESTS="srq_shared protection"
STAMP="kernel=$KPKG inputs=$(cat "$HERE/build-image.sh" "$HERE/vm/init" "$HERE/vm/agent" "$HERE/peer/cm_peer.c" \
    $(for t in $VM_C_TESTS; do echo "$HERE/../tests/c/$t.c"; done) | sha256sum | cut -c1-16) pkgs=$(echo $USER_PKGS | tr ' ' ,)"
if [ -f "$OUT/image.stamp" ] && [ "$(cat "$OUT/image.stamp")" = "$STAMP" ] && [ -f "$OUT/initramfs.gz" ]; then
    step "up to date ($OUT)"
    exit 0
fi
mkdir -p "$OUT/debs"
deb() {  # deb PKG: the path of PKG's .deb in $OUT/debs, downloaded once
    local f
    f=$(ls "$OUT/debs/${1}_"*.deb 2>/dev/null | head -1 || true)
    if [ -z "$f" ]; then
        (cd "$OUT/debs" && apt-get download -qq "$1" >/dev/null 2>&1) || { echo "apt-get download $1 failed" >&2; exit 1; }
        f=$(ls "$OUT/debs/${1}_"*.deb | head -1)
    fi
    echo "$f"
}

step "kernel $KPKG"
K=$OUT/kernel
rm -rf "$K" && mkdir -p "$K"
dpkg-deb -x "$(deb "$KPKG")" "$K"
cp "$K/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
depmod -b "$K" "$KVER"

step "siw from linux-source-$SERIES, against linux-headers-$KVER"
dpkg -s "linux-headers-$KVER" >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends "linux-headers-$KVER" >/dev/null
SRC=$OUT/src/siw
if [ ! -f "$SRC/siw_main.c" ]; then
    mkdir -p "$OUT/src"
    dpkg-deb --fsys-tarfile "$(deb "linux-source-$SERIES")" | tar -xO "./usr/src/linux-source-$SERIES.tar.xz" | xz -dc \
        | tar -x -C "$OUT/src" --strip-components=4 --wildcards "linux-source-$SERIES/drivers/infiniband/sw/siw/*"
fi
for variant in upstream params; do
    b=$OUT/build-$variant
    rm -rf "$b" && cp -r "$SRC" "$b"
    if [ $variant = params ]; then
        # siw's protocol knobs are `const bool`/`u_char` globals; make each a writable module parameter with
        # the same default so a test can boot siw with CRC required or peer-to-peer (RTR) mode on.
        knobs='zcopy_tx|try_gso|loopback_enabled|mpa_crc_required|mpa_crc_strict|siw_tcp_nagle|peer_to_peer'
        sed -i -E "s/^extern const bool ($knobs);/extern bool \1;/" "$b/siw.h"
        sed -i -E "s/^const bool ($knobs)( = [a-z]+)?;/bool \1\2;\nmodule_param(\1, bool, 0644);/" "$b/siw_main.c"
        sed -i -E 's/^(u_char mpa_version = MPA_REVISION_2;)/\1\nmodule_param(mpa_version, byte, 0644);/' "$b/siw_main.c"
        n=$(grep -c '^module_param(' "$b/siw_main.c")
        [ "$n" = 8 ] || { echo "siw parameter patch: $n of 8 knobs found (siw source changed?)" >&2; exit 1; }
    fi
    make -s -C "/lib/modules/$KVER/build" M="$b" CONFIG_RDMA_SIW=m modules 2>&1 | grep -v 'Skipping BTF' >&2 || true
    [ -f "$b/siw.ko" ] || { echo "building siw ($variant) failed" >&2; exit 1; }
done

step "cm_peer (rdma_cm endpoint) and the C tests run on both stacks, against the host's rdma-core"
gcc -O2 -Wall -o "$OUT/cm_peer" "$HERE/peer/cm_peer.c" -lrdmacm -libverbs
# The same sources the netns suites compile (tests/tests/srq.rs, protection.rs), run in the VM on siw.
for t in $VM_C_TESTS; do
    gcc -O2 -Wall -o "$OUT/$t" "$HERE/../tests/c/$t.c" -lrdmacm -libverbs
done

step "initramfs"
R=$OUT/root
rm -rf "$R" && mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib,proc,sys,dev,tmp,run,root,etc,sr}
ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib "$R/lib64"
# unpacked apart, then copied in keeping the merged-/usr symlinks (bookworm's libc6 still ships /lib/...)
rm -rf "$OUT/pkgs" && mkdir -p "$OUT/pkgs"
for p in $USER_PKGS; do dpkg-deb -x "$(deb "$p")" "$OUT/pkgs"; done
tar -C "$OUT/pkgs" -c . | tar -C "$R" -x --keep-directory-symlink
# libpsm-infinipath1's postinst makes this link through update-alternatives
ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$R/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
# rdma-core's test suite (tests/src/rdma_core_suite.rs) in /sr/rdma-core-tests, unzipped (Debian gzips docs)
mkdir -p "$R/sr/rdma-core-tests"
cp "$R/usr/share/doc/rdma-core/tests/"* "$R/sr/rdma-core-tests/"
gunzip "$R/sr/rdma-core-tests/"*.gz
# Python modules the suite does not use and whose libraries the image leaves out (or Python's own tests)
dyn=$R/usr/lib/python3.11/lib-dynload
rm -f "$dyn"/_ssl.* "$dyn"/_hashlib.* "$dyn"/_sqlite3.* "$dyn"/_dbm.* "$dyn"/_gdbm.* "$dyn"/_curses*.* \
    "$dyn"/readline.* "$dyn"/nis.* "$dyn"/_test*.* "$dyn"/_ctypes_test.* "$dyn"/xx*.* "$dyn"/_xx*.* \
    "$dyn"/ossaudiodev.* "$dyn"/audioop.* "$dyn"/_tkinter.*
rm -rf "$R/usr/lib/python3.11/test" "$R/usr/lib/python3.11/idlelib" "$R/usr/lib/python3.11/tkinter" \
    "$R/usr/lib/python3.11/ensurepip" "$R/usr/lib/python3.11/lib2to3" "$R/usr/lib/python3.11/pydoc_data"
rm -rf "$R/usr/share/doc" "$R/usr/share/man" "$R/usr/share/locale" "$R/usr/lib/x86_64-linux-gnu/gconv" \
    "$R/usr/bin/ss" "$R/usr/sbin/arpd" \
    "$R/usr/sbin/bridge" "$R/usr/sbin/devlink" "$R/usr/sbin/dcb" "$R/usr/sbin/tipc" "$R/usr/sbin/vdpa" \
    "$R/usr/bin/lnstat" "$R/usr/bin/nstat" "$R/usr/bin/rtacct" "$R/usr/bin/ctstat" "$R/usr/bin/rtstat" \
    "$R/usr/lib/x86_64-linux-gnu/tc" "$R/usr/sbin/genl" "$R/usr/sbin/rtmon"
cp /bin/busybox "$R/usr/bin/busybox"
for a in $(/bin/busybox --list); do
    [ -e "$R/usr/bin/$a" ] || [ -e "$R/usr/sbin/$a" ] || ln -s busybox "$R/usr/bin/$a"
done
: > "$R/sr/modules"
# sch_prio, sch_netem and cls_u32: `tc` delays one TCP port's segments from the VM (the qperf scenario)
for m in virtio_pci virtio_net crc32c_generic libcrc32c ib_uverbs rdma_ucm iw_cm rdma_cm sch_prio sch_netem \
    cls_u32; do
    modprobe -d "$K" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}' | while read -r f; do
        rel=/${f#"$K"/}
        grep -qxF "$rel" "$R/sr/modules" && continue
        mkdir -p "$R$(dirname "$rel")" && cp "$f" "$R$rel" && echo "$rel" >> "$R/sr/modules"
    done
done
strip --strip-debug -o "$R/sr/siw.ko" "$OUT/build-upstream/siw.ko"
strip --strip-debug -o "$R/sr/siw-params.ko" "$OUT/build-params/siw.ko"
install -m 755 "$HERE/vm/init" "$R/init"
install -m 755 "$HERE/vm/agent" "$OUT/cm_peer" "$R/sr/"
for t in $VM_C_TESTS; do install -m 755 "$OUT/$t" "$R/sr/"; done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
# every library any program needs must be in the image
bad=0
while read -r elf; do
    for lib in $(readelf -d "$elf" 2>/dev/null | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
        [ -e "$R/usr/lib/x86_64-linux-gnu/$lib" ] || [ -e "$R/usr/lib/$lib" ] || [ -e "$R/usr/lib64/$lib" ] \
            || { echo "missing $lib (needed by ${elf#"$R"})" >&2; bad=1; }
    done
done < <(find "$R/usr/bin" "$R/usr/sbin" "$R/sr" "$R/usr/lib/x86_64-linux-gnu" -type f \( -perm -u+x -o -name '*.so*' \) \
           -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
[ $bad = 0 ] || exit 1
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | gzip -6 > "$OUT/initramfs.gz.tmp"
mv "$OUT/initramfs.gz.tmp" "$OUT/initramfs.gz"
{
    echo "kernel: $KPKG $(dpkg-deb -f "$(deb "$KPKG")" Version)"
    echo "siw: linux-source-$SERIES $(dpkg-deb -f "$(deb "linux-source-$SERIES")" Version), $(modinfo -F vermagic "$OUT/build-upstream/siw.ko")"
    echo "rdma-core: $(dpkg-deb -f "$(deb rdmacm-utils)" Version)"
    echo "initramfs: $(du -h "$OUT/initramfs.gz" | cut -f1)"
} > "$OUT/build-info.txt"
echo "$STAMP" > "$OUT/image.stamp"
step "done: $(tr '\n' ';' < "$OUT/build-info.txt")"
