#!/bin/sh
# Park the base image's vendor apt sources before `apt-get update` (run by the GPU Dockerfiles).
#
# Why: AMD's apt signing key for repo.radeon.com has expired and been rotated several times (and
# NVIDIA rotated the CUDA repository's key in 2022); an old base image whose vendor lists are still
# enabled then fails `apt-get update` ("is not signed"), and the build stops. The images need only
# the distribution's own packages (Python, headers, g++), so vendor sources are set aside in
# /etc/apt/vendor-sources.disabled/ (apt never reads that folder), not deleted.
#
# usage: disable-vendor-apt.sh [ROOT]    ROOT: the filesystem root to edit (default /; tests use a
# fake tree). Harmless where there is nothing to disable (Debian stand-in bases).
set -eu
root=${1:-}
apt=$root/etc/apt
parked=$apt/vendor-sources.disabled
vendors='repo\.radeon\.com|developer\.download\.nvidia\.com'
[ -d "$apt" ] || exit 0
for list in "$apt"/sources.list.d/*.list "$apt"/sources.list.d/*.sources; do
    [ -f "$list" ] || continue
    if grep -Eq "$vendors" "$list"; then
        mkdir -p "$parked"
        mv "$list" "$parked/"
        echo "disabled vendor apt source ${list#"$root"}"
    fi
done
main=$apt/sources.list
if [ -f "$main" ] && grep -Eq "^[[:space:]]*deb.*($vendors)" "$main"; then
    sed -Ei "s%^([[:space:]]*deb.*($vendors).*)%# disabled by mics-repro: \\1%" "$main"
    echo "disabled vendor lines in ${main#"$root"}"
fi
