#!/usr/bin/env bash
# proxy-stack.sh MODE PORT REDIS_URL: an anchors EXTRA_STACKS app. The guide's /hello
# (sluice-example-hello --no-limiter, the trivial upstream, on PORT+1000) behind `sluice serve`
# as a reverse proxy on PORT. MODE: baseline (a route with no policy), allowed (limits never
# reached), denied (the guide's 10 burst + 5/s token bucket per x-api-key). The harness starts
# this with setsid and kills the process group, which ends both processes.
set -euo pipefail
mode=$1 port=$2 redis=$3
bin=${SLUICE_BIN_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release}
up=$((port + 1000)) http=$((port + 2000)) grpc=$((port + 3000))
dir=$(mktemp -d /tmp/sluice-proxy-stack.XXXXXX)
case $mode in
  baseline) policies='[]'; capacity=10; rate=5/s ;;
  allowed) policies='["burst"]'; capacity=1000000000; rate=1000000000/s ;;
  denied) policies='["burst"]'; capacity=10; rate=5/s ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
cat > "$dir/sluice.toml" <<END
[server]
http = "127.0.0.1:$http"
grpc = "127.0.0.1:$grpc"
proxy = "127.0.0.1:$port"

[store]
url = "$redis"

[policies.burst]
algorithm = "token-bucket"
capacity = $capacity
rate = "$rate"
identity = "api-key:x-api-key"

[[routes]]
prefix = "/"
policies = $policies
upstream = "http://127.0.0.1:$up"
END
"$bin/sluice-example-hello" --listen "127.0.0.1:$up" --no-limiter > "$dir/upstream.log" 2>&1 &
SLUICE_LOG=warn exec "$bin/sluice" serve --config "$dir/sluice.toml"
