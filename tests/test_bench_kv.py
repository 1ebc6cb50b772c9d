"""tests/test_bench_kv.py: tests/bench_kv.sh on stories260K with CPU workers and tiny sizes: each of its three
scenarios prints its line with a number (no FAILED line); the cached-TTFT run's warm requests hit the prefix cache
and its cold ones do not; the multi-turn load hits with --prefix-cache 1 and never with 0, gives the same outputs
both ways, and sends exactly the prompt tokens its turns make (each turn's prompt holds the previous turn's prompt
and output); the priority run's loaded bench prints its `hi:` line with probes. Bad values of the new options are
refused before anything is sent (exit 2), by `zllm bench` and by `zllm-worker`."""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, BUILD, ROOT, STORIES, Checks, watchdog  # noqa: E402

SIZES = {"LONG": 256, "REPS": 3, "CHATS": 4, "TURNS": 3, "SYS": 64, "NEW": 8, "OUT": 8, "LOAD_C": 4,
         "LOAD_N": 64, "LOAD_PROMPT": 16, "LOAD_OUT": "8:24", "HI_EVERY": 10, "LIMIT_S": 60, "START_S": 20}
NUM = r"([0-9]+(?:\.[0-9]+)?)"


def main():
    watchdog(170)
    ck = Checks("bench_kv")
    zllm = os.path.join(BIN, "zllm")
    for bad in (["--turns", "0"], ["--turns", "3"], ["--prefixes", "0"], ["--prefix-len", "0"],
                ["--hi-every", "0"], ["--hi-priority", "101"], ["--hi-prompt-len", "0"], ["--hi-out-len", "x"]):
        p = subprocess.run([zllm, "bench", "--broker", "ipc:///nonexistent", "-N", "64"] + bad, capture_output=True,
                           text=True, timeout=10)
        ck.ok(p.returncode == 2 and bad[0] in p.stderr, "zllm bench %s refused (rc %d, %r)" % (
            " ".join(bad), p.returncode, p.stderr.strip()[:80]))
    p = subprocess.run([os.path.join(BIN, "zllm-worker"), "--broker", "ipc:///nonexistent", "-m", "x.gguf",
                        "--prefix-cache", "2"], capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 2, "zllm-worker --prefix-cache 2 refused (rc %d)" % p.returncode)
    keep = tempfile.mkdtemp(prefix="zllm-test-bench-kv.")
    env = dict(os.environ, ZLLM_KV_KEEP=keep, ZLLM_KV_PRESET="", ZLLM_KV_WORKER_ARGS="--threads 1")
    env.update({"ZLLM_KV_" + k: str(v) for k, v in SIZES.items()})
    p = subprocess.run(["bash", os.path.join(ROOT, "tests", "bench_kv.sh"), BUILD, "cpu", STORIES],
                       capture_output=True, text=True, timeout=160, env=env)
    print(p.stdout.strip())
    out = p.stdout
    ck.ok(p.returncode == 0 and "FAILED" not in out, "bench_kv.sh ran every scenario (rc %d, %s)" % (
        p.returncode, p.stderr.strip()[-300:]))

    m = re.search(r"^ttft_cached_ratio %s \(warm p50 %s ms, cold p50 %s ms; 256-token prompts, first 230 sent before; "
                  r"warm hit %s%%, cold hit %s%%; bar <= 0.15: (met|not met)\)$" % ((NUM,) * 5), out, re.M)
    if ck.ok(m is not None, "a ttft_cached_ratio line with its figures"):
        ratio, warm, cold, warm_hit, cold_hit = (float(x) for x in m.groups()[:5])
        ck.ok(warm > 0 and cold > 0 and abs(ratio - warm / cold) < 0.01, "ratio %.3f = %.2f / %.2f" % (
            ratio, warm, cold))
        # 230 of 256 tokens sent before: 14 blocks of 16 (224 tokens) are found, 87.5% of each prompt
        ck.ok(warm_hit == 87.5, "warm requests find their 14 cached blocks (%.1f%% of their prompts)" % warm_hit)
        ck.ok(cold_hit == 0, "cold requests find nothing cached (%.1f%%)" % cold_hit)

    m = re.search(r"^multiturn_speedup %s \(cache on %s output tokens/s, off %s; hit on %s%%, off %s%%; outputs (\w+); "
                  r"4 chats x 3 turns, system prompt 64, 8 new and 8 output tokens a turn; bar >= 2: (met|not met)\)$"
                  % ((NUM,) * 5), out, re.M)
    if ck.ok(m is not None, "a multiturn_speedup line with its figures"):
        ratio, on, off, hit_on, hit_off = (float(x) for x in m.groups()[:5])
        ck.ok(on > 0 and off > 0 and abs(ratio - on / off) < 0.01, "ratio %.3f = %.1f / %.1f" % (ratio, on, off))
        ck.ok(hit_on > 0, "caching on: prompt tokens hit (%.1f%%)" % hit_on)
        ck.ok(hit_off == 0, "caching off: no prompt token hit (%.1f%%)" % hit_off)
        ck.ok(m.group(6) == "same", "the same outputs with caching on and off (%s)" % m.group(6))
    # turn t's prompt: the system prompt, t + 1 turns of new ids and the t previous outputs
    chats, turns, sys_, new, outl = (SIZES[k] for k in ("CHATS", "TURNS", "SYS", "NEW", "OUT"))
    want = chats * sum(sys_ + (t + 1) * new + t * outl for t in range(turns))
    for pc in (1, 0):
        try:
            text = open(os.path.join(keep, "s2-cache%d.txt" % pc)).read()
        except OSError:
            text = ""
        m = re.search(r"^cache: hit (\d+) of (\d+) prompt tokens .*; w1 (\d+)/(\d+)$", text, re.M)
        if ck.ok(m is not None, "--prefix-cache %d: a cache: line with the worker's counters" % pc):
            ck.ok(int(m.group(2)) == want, "--prefix-cache %d: %s prompt tokens admitted, %d made by the turns" % (
                pc, m.group(2), want))
        ck.ok(re.search(r"^requests: %d \(%d ok" % (chats * turns, chats * turns), text, re.M) is not None,
              "--prefix-cache %d: every turn ok" % pc)

    m = re.search(r"^priority_ttft_ratio %s \(probe p99 under load %s ms over (\d+) probes, idle %s ms; .*bar <= 1.2: "
                  r"(met|not met)\)$" % ((NUM,) * 3), out, re.M)
    if ck.ok(m is not None, "a priority_ttft_ratio line with its figures"):
        ck.ok(int(m.group(3)) >= 3, "probes sent while the load ran (%s)" % m.group(3))
    try:
        text = open(os.path.join(keep, "s3-loaded.txt")).read()
    except OSError:
        text = ""
    m = re.search(r"^hi: (\d+) probes of 32 tokens at priority 10, one every 10 ms \((\d+) ok\), ttft ms: p50 %s "
                  r"p90 %s p99 %s$" % ((NUM,) * 3), text, re.M)
    if ck.ok(m is not None, "the loaded bench prints a hi: line"):
        ck.ok(m.group(1) == m.group(2), "every probe ok (%s of %s)" % (m.group(2), m.group(1)))
        ck.ok(float(m.group(3)) <= float(m.group(5)), "probe p50 <= p99")
    ck.ok(re.search(r"^requests: 64 \(64 ok", text, re.M) is not None, "the low-priority load all ok")
    subprocess.run(["rm", "-rf", keep])
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
