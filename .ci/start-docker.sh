#!/usr/bin/env bash
# Start a real Docker engine on a Debian host (CI runners, sandboxes) when none answers.
# Idempotent: does nothing when `docker info` already reaches a daemon.
# No registry is reachable on these hosts, so images start from `make base-image` (debootstrap).
set -euo pipefail

log() { printf '[start-docker] %s\n' "$*"; }

if docker info >/dev/null 2>&1; then
    log "a Docker daemon already answers; nothing to do"
    exit 0
fi

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
if ((${#need_pkgs[@]})); then
    log "installing ${need_pkgs[*]} from the Debian archive"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${need_pkgs[@]}"
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    log "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
fi

# dockerd takes a few seconds to create its socket; a fixed sleep would be flaky on slow runners.
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        log "daemon is up: $(docker version --format '{{.Server.Version}}')"
        exit 0
    fi
    sleep 1
done
log "dockerd did not answer within 60 s; last lines of /var/log/dockerd.log:"
tail -n 30 /var/log/dockerd.log >&2 || true
exit 1
