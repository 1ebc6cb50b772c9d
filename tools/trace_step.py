#!/usr/bin/env python3
"""tools/trace_step.py TRACE.csv [--step K]: where one decode step's time goes, from cuda/lab/cupti_trace.c's CSV.

Takes the K-th last complete step (default 2: the one before the last; a step starts at the embedding kernel),
walks its kernels in start order and charges each kernel the time it advanced the step's frontier (the latest end
so far): the sum over kernels is the step's span, so these shares are the critical path by kernel kind. Also
prints each kind's summed own duration and the mean gap from the previous kernel's end to its start (negative:
overlap, as programmatic dependent launch allows). Matrix products are told apart by their place in the layer
(after the first norm: qkv ..., after the second: gate/up, then down)."""
import csv, re, sys, collections

def kind(name):
    n = name
    for pat, k in (('embed', 'embed'), ('rmsnorm', 'rmsnorm'), ('qkv_rope', 'rope+append'), ('swiglu', 'swiglu'),
                   ('attn', 'attention'), ('decode', 'attention'), ('merge', 'merge'), ('cast', 'cast'),
                   ('sampl', 'sample'), ('qtc_kernel', 'qtc'), ('qtc_wg', 'qtc-wg'), ('qtc_wide', 'qtc-wide'),
                   ('wtc', 'wtc'), ('gemm', 'cublas'), ('Kernel', 'cublas')):
        if pat in n: return k
    return re.sub(r'^_Z\d+', '', n)[:24]

def main():
    path = sys.argv[1]
    k_last = int(sys.argv[sys.argv.index('--step') + 1]) if '--step' in sys.argv else 2
    rows = []
    for r in csv.reader(open(path)):
        if len(r) < 9: continue
        rows.append((int(r[0]), int(r[1]), ','.join(r[8:])))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if 'embed' in r[2]]
    if len(starts) < k_last + 1:
        sys.exit('not enough steps in %s (%d embeddings)' % (path, len(starts)))
    a, b = starts[-k_last - 1], starts[-k_last]
    step = rows[a:b]
    t0, frontier = step[0][0], step[0][0]
    adv = collections.defaultdict(float); own = collections.defaultdict(float)
    gaps = collections.defaultdict(list); cnt = collections.Counter()
    last_norm = max([i for i, r in enumerate(step) if kind(r[2]) == 'rmsnorm'] or [-1])
    norms = 0; matn = 0; attn = False; prev_end = None
    for i, (s, e, n) in enumerate(step):
        k = kind(n)
        if k == 'rmsnorm':
            norms += 1; matn = 0; attn = False
        elif k == 'attention':
            attn = True
        elif k in ('qtc', 'qtc-wg', 'qtc-wide', 'wtc', 'cublas'):
            matn += 1
            if i > last_norm: k += ' lm head'
            elif norms % 2 == 1: k += ' wo' if attn else ' qkv' if matn == 1 else ' v'
            elif norms > 0: k += ' gate/up' if matn == 1 else ' down'
        a_ = max(0, e - frontier); frontier = max(frontier, e)
        adv[k] += a_; own[k] += e - s; cnt[k] += 1
        if prev_end is not None: gaps[k].append(s - prev_end)
        prev_end = e
    span = frontier - t0
    print('step span %.1f us, %d kernels' % (span / 1e3, len(step)))
    print('%-22s %5s %10s %7s %10s %9s' % ('kind', 'n', 'path us', 'path %', 'own us', 'gap us'))
    for k in sorted(adv, key=lambda k: -adv[k]):
        g = gaps[k]
        print('%-22s %5d %10.1f %6.1f%% %10.1f %9.2f' % (k, cnt[k], adv[k] / 1e3, 100 * adv[k] / span, own[k] / 1e3,
                                                        (sum(g) / len(g) / 1e3) if g else 0))

if __name__ == '__main__':
    main()
