#!/usr/bin/python3
"""trace_kinds.py TRACE.json [TRACE.json ...]: check Chrome traces written
by tdist (TDIST_TRACE, or tdist-fr --trace) and count their spans and
events per kind.

Checks, over all the files together (one process per rank): every file is
JSON with a traceEvents list; on each (process, thread) the spans ("X")
nest — each one, by start, ends before the next begins or contains it;
each group's collectives come in the order of their sequence numbers;
every "compute bucket" span lies inside a "backward" span. Prints one line
per kind, "span NAME COUNT" or "event NAME COUNT" (a trailing number, as
in "compute bucket 3", is left out of the kind), sorted; exits 1 on a
failed check.

Example, the trace of one DDP iteration:
  TDIST_TRACE=/tmp/t.json tdistrun --nproc-per-node 2 PROGRAM
  tools/trace_kinds.py /tmp/t.r*.json
"""
import collections
import json
import re
import sys

EPS = 1e-3  # microseconds: the writer prints ts and dur to the ns


def load(paths):
    events = []
    for p in paths:
        with open(p) as f:
            t = json.load(f)
        if not isinstance(t.get("traceEvents"), list):
            sys.exit("%s: no traceEvents list" % p)
        events += t["traceEvents"]
    return events


def check_nesting(spans):
    for key, v in spans.items():
        v.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in v:
            a, b = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][1] <= a + EPS:
                stack.pop()
            if stack and b > stack[-1][1] + EPS:
                sys.exit("spans cross on %s: %s [%.3f, %.3f] and %s [%.3f, %.3f]" %
                         (key, stack[-1][0], stack[-1][2], stack[-1][1], e["name"], a, b))
            stack.append((e["name"], b, a))


def check_order(spans):
    for key, v in spans.items():
        seqs = [e["args"]["seq"] for e in sorted(v, key=lambda e: e["ts"])
                if e.get("cat") == "collective"]
        if seqs != sorted(seqs):
            sys.exit("collectives out of order on %s: seq %s" % (key, seqs))


def check_backward(spans):
    for key, v in spans.items():
        back = [(e["ts"], e["ts"] + e["dur"]) for e in v if e["name"] == "backward"]
        for e in v:
            if not e["name"].startswith("compute bucket"):
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            if not any(x - EPS <= a and b <= y + EPS for x, y in back):
                sys.exit("%s on %s [%.3f, %.3f] is in no backward span" % (e["name"], key, a, b))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    spans = collections.defaultdict(list)
    kinds = collections.Counter()
    for e in load(sys.argv[1:]):
        name = re.sub(r" \d+$", "", e.get("name", ""))
        if e["ph"] == "X":
            spans[(e["pid"], e["tid"])].append(e)
            kinds["span " + name] += 1
        elif e["ph"] == "i":
            kinds["event " + name] += 1
    check_nesting(spans)
    check_order(spans)
    check_backward(spans)
    for k in sorted(kinds):
        print(k, kinds[k])


if __name__ == "__main__":
    main()
