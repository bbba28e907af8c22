#!/usr/bin/env bash
# A Docker engine of quire's own for `make compose-images` / `make compose-test`:
#   compose/engine.sh CMD ARGS...   start dockerd (unless ours already answers), run CMD
#                                   with DOCKER_HOST pointing at it, stop the daemon again
#                                   if this call started it (also on failure or Ctrl-C).
#   compose/engine.sh start|stop    the same halves, by hand.
#
# No systemd here: dockerd runs in the background with a pid file and a log, on a socket,
# data root and exec root of its own (QUIRE_DOCKER_*), so it neither needs nor touches a
# Docker the host may already run. Images stay in the data root between runs (the cache).
#
# --iptables=false --ip-forward=false --ip-masq=false --bridge=none: Docker adds no
# iptables rules, leaves the FORWARD policy and net.ipv4.ip_forward alone and makes no
# docker0, so network-namespace tests running beside it on this machine see the host as it
# was. What compose needs still works without them: containers of one compose network talk
# over its bridge, and published ports (127.0.0.1:9090 ...) go through docker-proxy. What
# is lost is NAT to the outside world, which no container needs (images are built with
# --network host).
set -euo pipefail

RUN_DIR=${QUIRE_DOCKER_RUN:-/run/quire-dockerd}
DATA_ROOT=${QUIRE_DOCKER_DATA:-/var/lib/quire-docker}
SOCK="$RUN_DIR/docker.sock"
PIDFILE="$RUN_DIR/dockerd.pid"
LOG=${QUIRE_DOCKER_LOG:-$DATA_ROOT.log}
export DOCKER_HOST="unix://$SOCK"

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start() {
  if answers; then return 1; fi           # already running: not ours to stop
  command -v dockerd >/dev/null || { echo "dockerd not found (make compose-deps)" >&2; exit 2; }
  mkdir -p "$RUN_DIR" "$DATA_ROOT"
  if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then rm -f "$PIDFILE"; fi
  local driver=overlay2
  [[ -n "${QUIRE_DOCKER_STORAGE:-}" ]] && driver=$QUIRE_DOCKER_STORAGE
  echo "starting dockerd (socket $SOCK, data $DATA_ROOT, storage $driver, log $LOG)" >&2
  setsid dockerd --host "$DOCKER_HOST" --data-root "$DATA_ROOT" --exec-root "$RUN_DIR/exec" \
    --pidfile "$PIDFILE" --storage-driver "$driver" \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
    </dev/null >>"$LOG" 2>&1 &
  local deadline=$((SECONDS + 60))
  until answers; do
    if ! kill -0 $! 2>/dev/null; then echo "dockerd exited; last lines of $LOG:" >&2; tail -20 "$LOG" >&2; exit 2; fi
    (( SECONDS < deadline )) || { echo "dockerd did not answer within 60s ($LOG)" >&2; exit 2; }
    sleep 0.5
  done
  return 0
}

stop() {
  [[ -f "$PIDFILE" ]] || return 0
  local pid; pid=$(cat "$PIDFILE")
  kill -TERM "$pid" 2>/dev/null || { rm -f "$PIDFILE"; return 0; }
  local deadline=$((SECONDS + 60))
  while kill -0 "$pid" 2>/dev/null; do
    (( SECONDS < deadline )) || { kill -KILL "$pid" 2>/dev/null || true; break; }
    sleep 0.5
  done
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start || true; echo "export DOCKER_HOST=$DOCKER_HOST" ;;
  stop) stop ;;
  "") echo "usage: $0 start|stop|CMD ARGS..." >&2; exit 2 ;;
  *)
    started=0
    if start; then started=1; fi
    trap '[[ $started == 1 ]] && stop' EXIT
    trap 'exit 130' INT TERM
    "$@"
    ;;
esac
