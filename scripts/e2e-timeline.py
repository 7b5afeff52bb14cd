#!/usr/bin/env python3
"""Where a message's time goes across processes, from the logs of `narad bench --e2e`.

Run the bench with NARAD_BENCH_SERVE_LOG=DIR: each `narad serve` it starts then logs every
HTTP request, every produced and delivered offset, and every storage request (with its
key, outcome and duration) to DIR/serve-N.log. This script joins them by partition and
offset: for SHOW messages it prints each storage request of the produce's commits and of
the consume's last two commits, in milliseconds from the produce request's start, and for
all messages the p50/p90 of the stages (docs/benchmarks.md, "Where a message's time goes").

Usage: scripts/e2e-timeline.py DIR [SHOW (5)]
"""
import re, sys, glob, os, datetime, collections, statistics

def ts(s):
    return datetime.datetime.strptime(s[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()

line_re = re.compile(r'^(\S+)\s+(\w+)\s+(.*?): (\S+): (.*)$')
def spans(ctx):
    req = re.search(r'request\{id=(\w+)', ctx)
    commits = re.findall(r'commit=(\d+)', ctx)
    cspan = re.search(r'commit\{kind="(\w+)" id=(\d+)', ctx)
    return (req.group(1) if req else None, commits, cspan.group(2) if cspan else None)

events = []  # (t, proc, kind, fields)
for path in sorted(glob.glob(os.path.join(sys.argv[1], "serve-*.log"))):
    proc = re.search(r'serve-(\d+)', path).group(1)
    for l in open(path):
        m = re.match(r'^(\S+) +(\w+) (.*)$', l.rstrip())
        if not m: continue
        t = ts(m.group(1)); rest = m.group(3)
        # split span context from target: message
        mm = re.match(r'^(.*?)(narad_shared::[\w:]+): (.*)$', rest)
        if not mm: continue
        ctx, target, msg = mm.groups()
        events.append((t, proc, ctx, target, msg))

req_done = {}
produced = {}
delivered = {}
store_by_commit = collections.defaultdict(list)
store_by_req = collections.defaultdict(list)
for t, proc, ctx, target, msg in events:
    req, commits, cspan = spans(ctx)
    if msg.startswith("request done"):
        ms = int(re.search(r'ms=(\d+)', msg).group(1))
        req_done[(proc, req)] = (t - ms / 1000, t, commits)
    elif msg.startswith("produced"):
        p, o = re.search(r'partition=(\d+) offset=(\d+)', msg).groups()
        produced[(int(p), int(o))] = (proc, req)
    elif msg.startswith("delivered"):
        p = int(re.search(r'partition=(\d+)', msg).group(1))
        for o in re.search(r'offsets=\[([\d, ]*)\]', msg).group(1).split(','):
            if o.strip():
                delivered.setdefault((p, int(o)), (proc, req))
    elif msg.startswith("store"):
        op = re.search(r'op="(\w+)"', msg).group(1)
        key = re.search(r'key="([^"]*)"', msg).group(1)
        us = int(re.search(r'us=(\d+)', msg).group(1))
        out = re.search(r'outcome=(\w+)', msg).group(1)
        rec = (t - us / 1e6, t, op, key, out)
        if cspan: store_by_commit[(proc, cspan)].append(rec)
        elif req: store_by_req[(proc, req)].append(rec)

def short(key):
    k = key.split('/')
    if key.endswith('manifest.json'): return 'manifest'
    if 'segments' in k:
        i = k[-1] if k[-1] else 'segments/'
        if '-i' in i: return 'intent ' + i.split('-i')[-1]
        return 'seg ' + i[-28:] if k[-1] else 'LIST segments/'
    return key[-40:]

lat_parts = collections.defaultdict(list)
show = int(sys.argv[2]) if len(sys.argv) > 2 else 5
shown = 0
for (p, o), (pproc, preq) in sorted(produced.items(), key=lambda kv: req_done.get(kv[1], (0,))[0]):
    if (p, o) not in delivered or (pproc, preq) not in req_done: continue
    cproc, creq = delivered[(p, o)]
    if (cproc, creq) not in req_done: continue
    p0, p1, pcommits = req_done[(pproc, preq)]
    c0, c1, ccommits = req_done[(cproc, creq)]
    lat_parts['produce'].append((p1 - p0) * 1000)
    lat_parts['e2e'].append((c1 - p0) * 1000)
    lat_parts['after produce answer'].append((c1 - p1) * 1000)
    pops = [r for c in pcommits for r in store_by_commit.get((pproc, c), [])]
    if pops:
        lat_parts['produce queued (start -> first storage request)'].append((min(r[0] for r in pops) - p0) * 1000)
    # the consume's last commit
    last = ccommits[-1] if ccommits else None
    cops = store_by_commit.get((cproc, last), [])
    if cops:
        lat_parts['consume last commit start -> answered'].append((c1 - min(r[0] for r in cops)) * 1000)
        lat_parts['produce answered -> consume last commit start'].append((min(r[0] for r in cops) - p1) * 1000)
    if shown < show and o > 50:
        shown += 1
        print(f"== p{p} o{o}: produce proc {pproc} {((p1-p0)*1000):.0f} ms, e2e {((c1-p0)*1000):.0f} ms, consumed by proc {cproc}")
        rows = []
        for c in pcommits:
            for r in store_by_commit.get((pproc, c), []): rows.append((r, f"P{pproc} commit {c}"))
        for c in ccommits[-2:]:
            for r in store_by_commit.get((cproc, c), []): rows.append((r, f"C{cproc} commit {c}"))
        for r in store_by_req.get((cproc, creq), []): rows.append((r, f"C{cproc} req"))
        rows.append(((p0, p0, 'produce', 'request start', ''), ''))
        rows.append(((p1, p1, 'produce', 'answered', ''), ''))
        rows.append(((c1, c1, 'consume', 'answered', ''), ''))
        for (s, e, op, key, out), who in sorted(rows):
            print(f"  {1000*(s-p0):7.1f} {1000*(e-p0):7.1f}  {who:18} {op:14} {short(key)} {out}")
for k, v in lat_parts.items():
    v = sorted(v)
    print(f"{k:45} n={len(v)} p50={v[len(v)//2]:.0f} p90={v[int(len(v)*0.9)]:.0f}")
