#!/usr/bin/env python3
"""Markdown tables for docs/benchmarks.md from scripts/bench's results folder (argv[1])."""
import json
import pathlib
import re
import statistics
import sys

OUT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/bench-results")


def jsonl(path):
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def ns(value, unit):
    return float(value) * {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6}[unit]


def embedded():
    path = OUT / "embedded.txt"
    if not path.exists():
        return
    text = path.read_text()
    rows = {}
    for m in re.finditer(r"^(\S+)\s+time:\s+\[(\S+) (\S+) (\S+) (\S+) (\S+) (\S+)\]", text, re.M):
        rows[m.group(1)] = ns(m.group(4), m.group(5))
    print("### Embedded store vs governor (ns per decision, criterion median)\n")
    print("Ratios are governor's time / sluice's (>= 1: sluice at least as fast). `check_one` is the store's")
    print("one-limit check (`Store::check_one`, what the limiter calls for one policy); `check` with one item")
    print("(`Store::check`, the multi-limit call) adds the one-element result `Vec`.\n")
    print("| scenario | governor GCRA | sluice GCRA `check_one` | sluice TB `check_one` | sluice GCRA `check` | sluice TB `check` | GCRA `check_one` ratio (target >= 1) | TB `check_one` ratio | GCRA `check` ratio | TB `check` ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for group in ["hot", "keys100k"]:
        for t in ["1t", "2t"]:
            for path_ in ["allowed", "denied"]:
                p = f"{group}/{t}/{path_}/"
                g, go, to, sg, st = (rows.get(p + k) for k in ["governor_gcra", "sluice_gcra", "sluice_tb", "sluice_gcra_vec", "sluice_tb_vec"])
                if g is None:
                    continue
                f = lambda x: f"{x:.0f}" if x else "-"
                r = lambda x: f"**{g / x:.2f}x**" if x else "-"
                print(f"| {group} {t} {path_} | {f(g)} | {f(go)} | {f(to)} | {f(sg)} | {f(st)} | {r(go)} | {r(to)} | {r(sg)} | {r(st)} |")
    print()
    other = {k: v for k, v in rows.items() if k.startswith(("algorithm/", "facade/"))}
    if other:
        print("| function | ns |")
        print("|---|---|")
        for k, v in other.items():
            print(f"| `{k}` | {v:.1f} |")
        print()
    counts = OUT / "embedded-counts.txt"
    if counts.exists():
        print("Instructions and cache misses per decision (cachegrind, `crates/bench/scripts/embedded-counts.sh`;")
        print("the simulated last level is one core's 512 KiB L2):\n")
        print("```text")
        print(counts.read_text().rstrip())
        print("```\n")


def stats(path):
    out = {"cmd": {}}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] in (["cpu0"], ["cpu1"]) and len(parts) == 3:
            out[parts[0]] = float(parts[1]) + float(parts[2])
        elif len(parts) == 3 and parts[1].isdigit():
            out["cmd"][parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def clients():
    d = OUT / "clients"
    if not d.exists():
        return
    names = [p.stem for p in sorted(d.glob("*.json"))]
    rows = {}
    for n in names:
        try:
            j = json.loads((d / f"{n}.json").read_text().strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            continue
        s = stats(d / f"{n}.stats")
        script = [s["cmd"].get(c, (0, 0)) for c in ("evalsha", "eval", "fcall")]
        calls = sum(c for c, _ in script)
        usec = sum(u for _, u in script)
        allcalls = sum(c for c, _ in s["cmd"].values())
        allusec = sum(u for _, u in s["cmd"].values())
        incl = j.get("decisions_incl_warmup") or j.get("decisions") or 1
        cpu = (s.get("cpu1", 0) - s.get("cpu0", 0)) * 1e6 / incl if "cpu1" in s else None
        rows[n] = dict(j=j, usec_call=usec / calls if calls else None, cmds=allcalls / incl,
                       usec_dec=usec / incl if calls else None, per_call=incl / calls if calls else None, cpu_dec=cpu)
    for ref in ["ref_before", "ref_after"]:
        p = d / f"{ref}.csv"
        if p.exists():
            lines = p.read_text().splitlines()
            if len(lines) >= 2:
                hdr = [h.strip('"') for h in lines[0].split(",")]
                val = [v.strip('"') for v in lines[1].split('","')]
                rps = float(val[hdr.index("rps")])
                s = stats(d / f"{ref}.stats")
                c, u = s["cmd"].get("evalsha", (0, 0))
                rows[ref] = dict(j={"decisions_per_s": rps, "p50_us": float(val[hdr.index("p50_latency_ms")]) * 1000,
                                    "p99_us": float(val[hdr.index("p99_latency_ms")]) * 1000, "errors": 0,
                                    "lib": "redis-benchmark -c 50 -P 1 (guide's script)"},
                                 usec_call=u / c if c else None, cmds=None, usec_dec=u / c if c else None,
                                 per_call=1.0, cpu_dec=None)
    rlf = rows.get("rlf_ioredis", {}).get("j", {}).get("decisions_per_s")
    guide = rows.get("ioredis_tb", {}).get("usec_dec")
    guide_cpu = rows.get("ioredis_tb", {}).get("cpu_dec")
    print("### Redis: decisions/s, latency and Redis cost per decision (one run)\n")
    print("| client | decisions/s | vs rate-limiter-flexible | p50 µs | p99 µs | errors | decisions per script call | script µs per call | script µs per decision | vs guide's script | Redis commands per decision | Redis CPU µs per decision | vs guide's | client CPU s/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        j = r["j"]
        dps = j.get("decisions_per_s") or 0
        f = lambda x, p=1: "-" if x is None else f"{x:.{p}f}"
        vs = f"{dps / rlf:.2f}x" if rlf else "-"
        vg = f"{r['usec_dec'] / guide:.2f}x" if guide and r["usec_dec"] else "-"
        vc = f"{r['cpu_dec'] / guide_cpu:.2f}x" if guide_cpu and r["cpu_dec"] else "-"
        print(f"| {n} | {dps:,.0f} | {vs} | {f(j.get('p50_us'), 0)} | {f(j.get('p99_us'), 0)} | {j.get('errors')} | "
              f"{f(r['per_call'], 1)} | {f(r['usec_call'], 2)} | {f(r['usec_dec'], 2)} | {vg} | {f(r['cmds'], 2)} | "
              f"{f(r['cpu_dec'], 2)} | {vc} | {f(j.get('client_cpu_s_per_s'), 2)} |")
    print()
    for alg, p16 in [("token_bucket", "bench_p16_token_bucket"), ("gcra", "bench_p16_gcra"), ("fixed_window", "bench_p16_fixed_window")]:
        s = rows.get(f"sluice_{alg}", {}).get("j", {}).get("decisions_per_s")
        c = rows.get(p16, {}).get("j", {}).get("decisions_per_s")
        if s and c:
            print(f"- sluice {alg}: {s:,.0f}/s = **{s / c:.2f}x** its own script's redis-benchmark -P 16 ceiling ({c:,.0f}/s); target >= 0.9x")
    s = rows.get("sluice_token_bucket", {}).get("j", {}).get("decisions_per_s")
    if s and rlf:
        print(f"- sluice token bucket vs rate-limiter-flexible: **{s / rlf:.2f}x** (target >= 2x in each of 3 runs)")
    for alg in ["token_bucket", "gcra"]:
        r = rows.get(f"sluice_{alg}", {})
        u, c = r.get("usec_dec"), r.get("cpu_dec")
        if u and guide:
            print(f"- sluice {alg}: Redis script time {u:.2f} µs per decision vs the guide's {guide:.2f} µs (ioredis row) = "
                  f"**{u / guide:.2f}x**; Redis process CPU {c:.2f} vs {guide_cpu:.2f} µs per decision = **{c / guide_cpu:.2f}x** (target <= 0.3x)")
        p1 = rows.get(f"bench_p16_{alg}", {}).get("usec_dec")
        if p1 and guide:
            print(f"  (one decision per call, redis-benchmark -P 16: {p1:.2f} µs = {p1 / guide:.2f}x the guide's)")
    print()


def flood():
    rows = jsonl(OUT / "flood-token-bucket.jsonl") + jsonl(OUT / "flood-gcra.jsonl")
    if not rows:
        return
    print("### Denied-path flood (64 in flight on 100 identities far over their limit)\n")
    print("| algorithm | deny cache | decisions/s | denied share | Redis script calls per request | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["allowed"] + r["denied"]
        print(f"| {r['algorithm']} | {r['deny_cache']} | {r['decisions_per_s']:,.0f} | {r['denied'] / max(n, 1):.4f} | "
              f"{r['redis_calls_per_request']:.4f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} |")
    print()


def memory():
    red = {r["algorithm"]: r for r in jsonl(OUT / "memory-redis.jsonl")}
    emb = {r["algorithm"]: r for r in jsonl(OUT / "memory-embedded.jsonl")}
    if red or emb:
        print("### Bytes per key\n")
        print("| algorithm | Redis MEMORY USAGE | Redis used_memory growth / key | embedded RSS growth / key (1M keys) | embedded ns per decision (1M keys) |")
        print("|---|---|---|---|---|")
        for a in sorted(set(red) | set(emb), key=lambda a: list(red).index(a) if a in red else 99):
            r, e = red.get(a, {}), emb.get(a, {})
            f = lambda x: "-" if x is None else f"{x:.0f}"
            print(f"| {a} | {f(r.get('memory_usage_bytes_per_key'))} | {f(r.get('used_memory_bytes_per_key'))} | "
                  f"{f(e.get('rss_bytes_per_key'))} | {f(e.get('ns_per_decision'))} |")
        print()
    g = jsonl(OUT / "growth.jsonl")
    if g:
        print("### Growth with the number of identities (GCRA)\n")
        print("| identities | embedded decisions/s | embedded RSS / key | Redis decisions/s | Redis p50 / p99 µs | Redis used_memory (MB) | Redis keys at end |")
        print("|---|---|---|---|---|---|---|")
        emb_g = {r["keys"]: r for r in g if r.get("store") == "memory"}
        red_g = {r["keys"]: r for r in g if r.get("store") == "redis"}
        for n in sorted(set(emb_g) | set(red_g)):
            e, r = emb_g.get(n, {}), red_g.get(n, {})
            run = r.get("run", {})
            print(f"| {n:,} | {e.get('decisions_per_s', 0):,.0f} | {e.get('rss_bytes_per_key', 0):.0f} | "
                  f"{run.get('decisions_per_s', 0):,.0f} | {run.get('p50_us', 0):.0f} / {run.get('p99_us', 0):.0f} | "
                  f"{r.get('used_memory', 0) / 1e6:.1f} | {r.get('dbsize', '-')} |")
        print()


def rls():
    rows = jsonl(OUT / "rls.jsonl")
    if not rows:
        return
    print("### Envoy RLS: ShouldRateLimit (64 in flight, one HTTP/2 channel, 100k descriptor values)\n")
    print("| store | calls/s | OK | OVER_LIMIT | errors | p50 µs | p99 µs | driver CPU s/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.get('store')} | {r['calls_per_s']:,.0f} | {r['allowed']} | {r['over_limit']} | {r['errors']} | "
              f"{r['p50_us'] or 0:.0f} | {r['p99_us'] or 0:.0f} | {r.get('client_cpu_s_per_s')} |")
    print()


def rls_anchor():
    # Written whole by scripts/bench-rls-anchor (its tables from rls-anchor.jsonl).
    f = OUT / "rls-anchor.md"
    if f.exists():
        print(f.read_text().rstrip() + "\n")


def cluster():
    f = OUT / "cluster.txt"
    if not f.exists():
        return
    print("### Redis Cluster (3 masters) vs standalone (`redis-ab.sh`, interleaved)\n")
    print("```text")
    print(f.read_text().rstrip())
    print("```\n")


embedded()
clients()
cluster()
flood()
memory()
rls()
rls_anchor()
