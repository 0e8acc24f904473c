#!/usr/bin/env bash
# Leased mode vs no limiter (and exact mode) through the HTTP layer on Redis, on loopback.
#
#   examples/hello/bench-leased.sh HELLO_BINARY [ROUNDS]
#
# Starts one redis-server and three copies of the hello app (no limiter, exact, leased) on free
# loopback ports, then runs `wrk -t2 -c64 -d5s` against them interleaved (baseline, exact,
# leased, baseline, ...) for ROUNDS rounds (default 3), after a 1 s warm-up of each. For each limited run it reads Redis's
# `INFO commandstats` before and after, so the Redis calls per request are that run's own.
# The bucket (1e9, refilled at 1e9/s) admits every request: this measures the allowed path.
set -euo pipefail

HELLO=${1:?usage: bench-leased.sh HELLO_BINARY [ROUNDS]}
ROUNDS=${2:-3}
REDIS=${REDIS_SERVER:-redis-server}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

RPORT=$(free_port)
"$REDIS" --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
PIDS=($!)
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

LIMIT=(--capacity 1000000000 --rate 1000000000/s)
declare -A PORT
for mode in baseline exact leased; do
  PORT[$mode]=$(free_port)
  case $mode in
    baseline) args=(--no-limiter) ;;
    exact) args=(--store "redis://127.0.0.1:$RPORT" "${LIMIT[@]}") ;;
    leased) args=(--store "redis://127.0.0.1:$RPORT" "${LIMIT[@]}" --mode leased) ;;
  esac
  "$HELLO" --listen "127.0.0.1:${PORT[$mode]}" "${args[@]}" >/dev/null &
  PIDS+=($!)
done
sleep 1

# Redis calls answered so far: the script calls the stores make (commandstats also counts the
# commands a script runs inside, which are not round trips).
calls() {
  redis-cli -p "$RPORT" info commandstats |
    awk -F'[:=,]' '$1 ~ /^cmdstat_(eval|evalsha|evalsha_ro|eval_ro|fcall|fcall_ro)$/ { n += $3 } END { print n + 0 }'
}

# Warm-up: connections, the script cache, the first slices.
for mode in baseline exact leased; do
  wrk -t2 -c64 -d1s "http://127.0.0.1:${PORT[$mode]}/hello" -H 'x-api-key: bench' >/dev/null
done

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-9s %12s %14s %8s\n' round mode req/s redis/request non-2xx
for round in $(seq "$ROUNDS"); do
  for mode in baseline exact leased; do
    before=$(calls)
    out=$(wrk -t2 -c64 -d5s "http://127.0.0.1:${PORT[$mode]}/hello" -H 'x-api-key: bench')
    after=$(calls)
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
    total=$(awk '/requests in/ { print $1 }' <<<"$out")
    bad=$(awk '/Non-2xx/ { print $5 }' <<<"$out")
    per=$(python3 -c "print(f'{($after - $before) / max($total, 1):.4f}')")
    [ "$mode" = baseline ] && per=-
    printf '%-6s %-9s %12s %14s %8s\n' "$round" "$mode" "$rps" "$per" "${bad:-0}"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
