#!/usr/bin/env bash
# rls-serve.sh GRPC_PORT STORE_URL: `sluice serve` with only Envoy's rate limit service on
# GRPC_PORT, domain "bench": each descriptor user=<value> a 10 burst + 5/s token bucket.
set -euo pipefail
grpc=$1 store=$2
bin=${SLUICE_BIN_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release}
dir=$(mktemp -d /tmp/sluice-rls.XXXXXX)
cat > "$dir/bench.yaml" <<END
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 5
      algorithm: token-bucket
END
cat > "$dir/sluice.toml" <<END
[server]
http = "127.0.0.1:$((grpc + 1000))"
grpc = "127.0.0.1:$grpc"

[store]
url = "$store"

[envoy]
files = ["bench.yaml"]
END
SLUICE_LOG=warn exec "$bin/sluice" serve --config "$dir/sluice.toml"
