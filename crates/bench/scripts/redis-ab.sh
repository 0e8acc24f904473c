#!/usr/bin/env bash
# redis-ab.sh: side-by-side runs of Redis clients on one private redis-server and one private
# 3-master Redis Cluster (no replicas), all on free loopback ports and stopped by PID at the
# end. Per run: decisions/s, Redis script µs per decision (INFO commandstats usec of
# EVALSHA+EVAL+FCALL over every master / decisions including the warm-up), script µs per call
# (the same usec / script calls: commandstats' usec_per_call), Redis CPU µs per decision
# (used_cpu_user+sys of every master / decisions: the server's own CPU, which a process
# waiting for a core does not inflate, unlike commandstats' wall-clock usec), script calls and
# GET/MGET/SET per decision, the load average. At the end, per label: Cluster / standalone
# ratios of script µs and CPU µs per decision over every pair of that label. BREAKDOWN=1 adds
# every command's usec per decision. Runs go in the order given, so interleave A/B/A/B.
#
#   crates/bench/scripts/redis-ab.sh SECONDS "label|single|cmd" "label|cluster|cmd" ...
#
# In cmd, {URL} is the server's URL (redis://... or redis+cluster://...), {URL_SCRIPTS} the same
# URL as the user `scripts-only`, which every server here refuses functions (FCALL, FUNCTION),
# so sluice's batches run as scripts (EVALSHA) instead of the batch library (FCALL), {PORT} the
# standalone port and {DUR} the seconds. Example (two builds of sluice-bench, the guide's script over
# ioredis and rate-limiter-flexible from the anchors harness's clients/):
#   redis-ab.sh 8 "old|single|/tmp/old redis --redis {URL} --duration {DUR} --warmup 1" \
#     "new|single|/tmp/new redis --redis {URL} --duration {DUR} --warmup 1" \
#     "new|cluster|/tmp/new redis --redis {URL} --duration {DUR} --warmup 1" \
#     "rlf|single|node clients/node_rlf.mjs --port {PORT} --duration {DUR} --warmup 1"
set -uo pipefail
DUR=$1; shift
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
WORK=$(mktemp -d /tmp/redis-ab.XXXXXX)
PIDS=()
stop() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap stop EXIT
CPORTS=()
for _ in 1 2 3; do
  while :; do p=$(fp); [ "$p" -lt 55000 ] && break; done # the cluster bus is port + 10000
  mkdir -p "$WORK/$p"
  (cd "$WORK/$p" && exec /usr/bin/redis-server --port "$p" --bind 127.0.0.1 --save "" \
    --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf --daemonize no \
    --logfile "$WORK/$p/log") &
  PIDS+=($!); CPORTS+=("$p")
done
SP=$(fp)
/usr/bin/redis-server --port "$SP" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --logfile "$WORK/single.log" &
PIDS+=($!)
for p in "${CPORTS[@]}" "$SP"; do
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create $(for p in "${CPORTS[@]}"; do printf "127.0.0.1:%s " "$p"; done) \
  --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do
  redis-cli -p "${CPORTS[0]}" cluster info | grep -q cluster_state:ok && break; sleep 0.1
done
CURL="redis+cluster://$(IFS=,; echo "${CPORTS[*]/#/127.0.0.1:}")"
CURL_SCRIPTS="redis+cluster://scripts-only:ab@$(IFS=,; echo "${CPORTS[*]/#/127.0.0.1:}")"
for p in "${CPORTS[@]}" "$SP"; do
  redis-cli -p "$p" ACL SETUSER scripts-only on '>ab' '~*' '&*' +@all -fcall -fcall_ro -function >/dev/null
done
# cpu PORT...: used_cpu_user+sys summed over the given servers, in s
cpu() {
  for p in "$@"; do redis-cli -p "$p" INFO cpu; done | tr -d '\r' |
    awk -F: '/^used_cpu_(user|sys):/{s+=$2} END{printf "%.6f", s}'
}
RESULTS="$WORK/results.jsonl"
printf '%-16s %-8s %10s %10s %9s %8s %8s %9s %8s %8s %s\n' label target dec/s per_master script_us us/call cpu_us calls/dec get/dec set/dec load
for spec in "$@"; do
  label=${spec%%|*}; rest=${spec#*|}; target=${rest%%|*}; cmd=${rest#*|}
  if [ "$target" = cluster ]; then ports=("${CPORTS[@]}"); url=$CURL; url_scripts=$CURL_SCRIPTS
  else ports=("$SP"); url=redis://127.0.0.1:$SP/0; url_scripts=redis://scripts-only:ab@127.0.0.1:$SP/0; fi
  cmd=${cmd//\{URL_SCRIPTS\}/$url_scripts}; cmd=${cmd//\{URL\}/$url}; cmd=${cmd//\{PORT\}/$SP}; cmd=${cmd//\{DUR\}/$DUR}
  for p in "${ports[@]}"; do
    redis-cli -p "$p" FLUSHALL >/dev/null; redis-cli -p "$p" SCRIPT FLUSH >/dev/null
    redis-cli -p "$p" FUNCTION FLUSH >/dev/null
    redis-cli -p "$p" CONFIG RESETSTAT >/dev/null
  done
  cpu0=$(cpu "${ports[@]}")
  out=$(timeout $((DUR * 4 + 60)) $cmd 2>/dev/null | tail -1)
  cpu1=$(cpu "${ports[@]}")
  stats=""; for p in "${ports[@]}"; do stats+=$(redis-cli -p "$p" INFO commandstats | tr -d '\r')$'\n'; done
  python3 - "$label" "$target" "$out" "$stats" "${#ports[@]}" "$cpu0" "$cpu1" \
    "$(cut -d' ' -f1 /proc/loadavg)" "$RESULTS" <<'PY'
import json, os, re, sys
label, target, out, stats, masters, cpu0, cpu1, load, results = sys.argv[1:]
try:
    o = json.loads(out)
except ValueError:
    print(f"{label:16s} {target:8s} no JSON result: {out[:200]!r}")
    sys.exit(0)
n = o.get("decisions_incl_warmup") or o["decisions"]
st = {}
for line in stats.splitlines():
    m = re.match(r"cmdstat_([\w|]+):calls=(\d+),usec=(\d+)", line)
    if m:
        c, u = st.get(m.group(1), (0, 0))
        st[m.group(1)] = (c + int(m.group(2)), u + int(m.group(3)))
scr = sum(st.get(c, (0, 0))[1] for c in ("evalsha", "eval", "fcall"))
calls = sum(st.get(c, (0, 0))[0] for c in ("evalsha", "eval", "fcall"))
gets = st.get("get", (0, 0))[0] + st.get("mget", (0, 0))[0]
sets = st.get("set", (0, 0))[0]
cpu = (float(cpu1) - float(cpu0)) * 1e6 / n
rate = o["decisions_per_s"]
per_call = scr / calls if calls else 0.0
print(f"{label:16s} {target:8s} {rate:10.0f} {rate / int(masters):10.0f} {scr / n:9.2f} {per_call:8.2f} "
      f"{cpu:8.2f} {calls / n:9.4f} {gets / n:8.4f} {sets / n:8.4f} {load} errors={o.get('errors')}")
with open(results, "a") as f:
    f.write(json.dumps({"label": label, "target": target, "script_us": scr / n, "cpu_us": cpu,
                        "per_call": per_call, "rate": rate}) + "\n")
if os.environ.get("BREAKDOWN"):
    print("    µs per decision: " + ", ".join(
        f"{c} {u / n:.3f} ({u / max(k, 1):.2f}/call)" for c, (k, u) in sorted(st.items())
        if c not in ("info", "config|resetstat", "flushall")))
PY
done
# Cluster / standalone per label, over every run of that label (sums, so each run weighs by
# its decisions' cost, not by its count).
[ -s "$RESULTS" ] && python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for label in dict.fromkeys(r["label"] for r in rows):
    side = {t: [r for r in rows if r["label"] == label and r["target"] == t] for t in ("single", "cluster")}
    if not side["single"] or not side["cluster"]:
        continue
    mean = lambda t, k: sum(r[k] for r in side[t]) / len(side[t])
    print(f"{label}: Cluster / standalone over {len(side['cluster'])}+{len(side['single'])} runs: "
          f"script µs per decision {mean('cluster', 'script_us'):.2f} / {mean('single', 'script_us'):.2f} = "
          f"{mean('cluster', 'script_us') / mean('single', 'script_us'):.2f}x; "
          f"Redis CPU µs per decision {mean('cluster', 'cpu_us'):.2f} / {mean('single', 'cpu_us'):.2f} = "
          f"{mean('cluster', 'cpu_us') / mean('single', 'cpu_us'):.2f}x; "
          f"script µs per call {mean('cluster', 'per_call'):.1f} / {mean('single', 'per_call'):.1f}")
PY
