#!/bin/bash
# Builds the Debian package kiln_<version>_<arch>.deb with dpkg-deb alone (cargo-deb users get the
# same layout from [package.metadata.deb] in Cargo.toml):
#   /usr/bin/kiln                      the binary (stripped)
#   /lib/systemd/system/kiln-*         kiln-serve.service, kiln-nightly.service and .timer (not enabled)
#   /usr/share/kiln/images, specs      the image specs `kiln provision` finds; the example SKU specs
#   /usr/share/doc/kiln/               README, agent.toml.example
#   /var/lib/kiln                      the results database's directory
# No maintainer scripts: the service users are systemd's DynamicUser, and nothing is enabled or
# started on install (`systemctl enable --now kiln-nightly.timer` is the site's decision).
#
# usage: deploy/deb/build-deb.sh [--binary PATH] [--out DIR] [--compress xz|gzip|none]
set -euo pipefail
cd "$(dirname "$0")/../.."

binary=target/release/kiln
out=target/deb
compress=xz
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --compress) compress=$2; shift 2 ;;
        *) echo "build-deb.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ -x "$binary" ] || { echo "build-deb.sh: $binary is not an executable: run cargo build --release first" >&2; exit 2; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

install -D -m0755 "$binary" "$stage/usr/bin/kiln"
if command -v strip >/dev/null; then strip --strip-debug "$stage/usr/bin/kiln"; fi
for unit in deploy/systemd/*; do install -D -m0644 "$unit" "$stage/lib/systemd/system/$(basename "$unit")"; done
for dir in images specs; do
    mkdir -p "$stage/usr/share/kiln/$dir"
    cp -r "$dir/." "$stage/usr/share/kiln/$dir/"
done
install -D -m0644 README.md "$stage/usr/share/doc/kiln/README.md"
install -D -m0644 deploy/agent.toml.example "$stage/usr/share/doc/kiln/agent.toml.example"
install -d -m0755 "$stage/var/lib/kiln"

size=$(du -sk "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: kiln
Version: $version
Architecture: $arch
Maintainer: kiln developers <kiln@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.31), ca-certificates
Recommends: libopenblas0-pthread
Suggests: libdnnl2, libblis4-pthread
Section: admin
Priority: optional
Description: inventory, provision, benchmark and compare AI training servers
 kiln takes a server's hardware inventory, provisions drivers from image specs,
 benchmarks the box, stores every result, judges it against its SKU's spec and
 uploads results to a fleet service (kiln serve).
CONTROL

mkdir -p "$out"
deb="$out/kiln_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$stage" "$deb" >/dev/null
echo "$deb"
