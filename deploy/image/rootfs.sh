#!/usr/bin/env bash
# Assembles the root filesystem of the sluice image from a built binary:
#   deploy/image/rootfs.sh BINARY DEST
# DEST gets the binary at /usr/local/bin/sluice, exactly the shared libraries `ldd` names
# (with the dynamic loader), CA certificates for rediss://, a passwd/group naming the
# unprivileged user 65532 (sluice), /etc/sluice/sluice.toml (deploy/image/sluice.toml: the
# embedded store, every listener on 0.0.0.0, tokens from the environment) and an empty /tmp.
# Used by both the Containerfile and scripts/image, so the two produce the same tree.
# Every file's time is set to SOURCE_DATE_EPOCH (default: the last commit's time) so that
# the same inputs give the same layer.
set -euo pipefail
bin=$1
dest=$2
here="$(cd "$(dirname "$0")" && pwd)"
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct 2>/dev/null || echo 0)}

rm -rf "$dest"
mkdir -p "$dest"/{usr/local/bin,etc/sluice,etc/ssl/certs,tmp}
chmod 1777 "$dest/tmp"
install -m 0755 "$bin" "$dest/usr/local/bin/sluice"
# The libraries the binary loads, and the loader itself, at the paths ldd resolves.
ldd "$bin" | awk '/=> \// { print $3 } /^[[:space:]]*\/.*ld-linux/ { print $1 }' | sort -u | while read -r lib; do
  mkdir -p "$dest$(dirname "$lib")"
  cp -L "$lib" "$dest$lib"
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$dest/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/:/sbin/nologin\nsluice:x:65532:65532:sluice:/:/sbin/nologin\n' > "$dest/etc/passwd"
printf 'root:x:0:\nsluice:x:65532:\n' > "$dest/etc/group"
install -m 0644 "$here/sluice.toml" "$dest/etc/sluice/sluice.toml"
find "$dest" -exec touch -h -d "@$epoch" {} +
