#!/usr/bin/env python3
"""tools/http_turns.py SCRIPT: zllm-http's loop turns and when it reads requests, from a system-call trace of the
gateway process (docs/perf.md, "HTTP gateway"):

    perf record -e syscalls:sys_enter_epoll_wait -e syscalls:sys_exit_epoll_wait -e syscalls:sys_exit_recvfrom \\
        -e syscalls:sys_enter_sendto -p GATEWAY_PID -o gw.data -- sleep 2
    perf script -i gw.data -F tid,time,event,trace > gw.txt
    python3 tools/http_turns.py gw.txt

A turn runs from the return of the loop's epoll_wait (the one with 256 events, http/gw_server.c) to its next call;
within it the script counts the requests read (a recvfrom on the loop's thread returning 200..2000 bytes: one
streamed /v1/completions request of tests/bench_http.py) and the writes (sendto). It prints the turns' lengths, how
many requests were read in turns that also wrote more than 100 chunks, and how bunched the reads were: for each
request, the number read in the same millisecond."""
import collections
import re
import sys


def main():
    lines = open(sys.argv[1]).read().splitlines()
    rx = re.compile(r"^\s*(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
    ev = [m.groups() for m in map(rx.match, lines) if m]
    if not ev:
        sys.exit("no events in %s" % sys.argv[1])
    main_tid = min(int(e[0]) for e in ev)  # the process's first thread runs the loop
    turns, reads, cur, outer_fd = [], [], None, None
    for tid, t, name, args in ev:
        if int(tid) != main_tid:
            continue
        t = float(t)
        if name.endswith("sys_enter_epoll_wait"):
            fd = re.search(r"epfd: (0x[0-9a-f]+)", args).group(1)
            if outer_fd is None and "maxevents: 0x00000100" in args:
                outer_fd = fd
            if fd == outer_fd:
                if cur is not None and "start" in cur:
                    turns.append((cur["start"], t, cur["reads"], cur["writes"]))
                cur = {"reads": 0, "writes": 0, "waiting": True}
        elif name.endswith("sys_exit_epoll_wait") and cur is not None and cur.get("waiting"):
            cur["start"], cur["waiting"] = t, False
        elif cur is not None and name.endswith("sys_exit_recvfrom"):
            n = int(args.split()[-1], 16) if args.split()[-1].startswith("0x") else int(args.split()[-1])
            if 200 <= n <= 2000:
                cur["reads"] += 1
                reads.append(t)
        elif cur is not None and name.endswith("sys_enter_sendto"):
            cur["writes"] += 1
    if not turns:
        sys.exit("no complete loop turn in %s" % sys.argv[1])
    busy = sorted(e - s for s, e, _, _ in turns)
    n = len(busy)

    def pct(v, p):
        return v[min(len(v) - 1, max(0, int(p / 100.0 * len(v) + 0.999) - 1))]

    span = turns[-1][1] - turns[0][0]
    print("%d turns over %.2f s, busy %.2f s; turn ms: p50 %.3f p90 %.3f p99 %.3f max %.3f" % (
        n, span, sum(busy), pct(busy, 50) * 1e3, pct(busy, 90) * 1e3, pct(busy, 99) * 1e3, busy[-1] * 1e3))
    big = [x for x in turns if x[3] > 100]
    print("turns writing more than 100 chunks: %d, %.2f ms and %.0f writes on average; %d of the %d requests were "
          "read in them" % (len(big), sum(e - s for s, e, _, _ in big) / max(1, len(big)) * 1e3,
                            sum(w for _, _, _, w in big) / max(1, len(big)), sum(r for _, _, r, _ in big),
                            sum(r for _, _, r, _ in turns)))
    if reads:
        per_ms = collections.Counter(int(t * 1000) for t in reads)
        seen = sorted(per_ms[int(t * 1000)] for t in reads)
        print("requests read: %d; read in the same millisecond as a request: p50 %d p99 %d max %d" % (
            len(reads), pct(seen, 50), pct(seen, 99), seen[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
