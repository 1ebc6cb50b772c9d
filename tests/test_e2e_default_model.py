"""tests/test_e2e_default_model.py: the default model (SmolLM2-135M-Instruct Q4_1, `bash deploy/fetch-model.sh`)
served by a real broker and CPU worker answers "What is the capital of France?" with text that mentions Paris,
greedily, through `zllm generate --chat`, `zllm chat`, the Python Client (generate and stream) and AsyncClient;
and all of them agree on the answer. (Kept to four short generations: the CPU of a CI machine is shared.)"""
import asyncio
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_cluster import BIN, ROOT, Cluster, Checks, watchdog, zllm  # noqa: E402

Q = "What is the capital of France?"


def main():
    watchdog(150)
    ck = Checks("e2e_default_model")
    try:
        model = subprocess.run(["bash", os.path.join(ROOT, "deploy", "fetch-model.sh")], check=True,
                               capture_output=True, text=True, timeout=300).stdout.strip()
    except Exception as e:
        ck.ok(False, "fetch-model.sh: %s" % e)
        return ck.report()
    cl = Cluster(model=model, model_name="smollm2")
    try:
        cl.start_broker()
        cl.start_worker("w1", max_batch=4)
        if not ck.ok(cl.wait_workers(["w1"], timeout=30) is not None, "worker registered"):
            return ck.report()
        zllm_bin = os.path.join(BIN, "zllm")
        msgs = [{"role": "user", "content": Q}]
        p = subprocess.run([zllm_bin, "generate", "--broker", cl.clients_ep, "--chat", "-p", Q, "-n", "48", "--temp",
                            "0"], capture_output=True, text=True, timeout=60)
        print("zllm generate --chat: %r" % p.stdout.strip())
        ck.ok(p.returncode == 0, "zllm generate exit status %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
        ck.ok("Paris" in p.stdout, "zllm generate --chat mentions Paris: %r" % p.stdout)
        c = cl.client()
        r = c.generate(messages=msgs, max_tokens=48, temperature=0, timeout=60)
        print("Python Client: %r (%s)" % (r.text, r.finish_reason))
        ck.ok("Paris" in r.text, "Python client mentions Paris: %r" % r.text)
        ck.ok(r.finish_reason == "stop" and len(r.token_ids) > 0, "ends with stop: %s, %d ids" % (
            r.finish_reason, len(r.token_ids)))
        ck.ok(r.text.strip() == p.stdout.strip(), "the C command and the Python client agree")
        async def run_async():
            ac = zllm.AsyncClient(cl.clients_ep)
            try:
                deltas = []
                async for d in ac.stream(messages=msgs, max_tokens=48, temperature=0, timeout=60):
                    deltas.append(d)
                st = await ac.status()
                return deltas, st
            finally:
                ac.close()
        deltas, st = asyncio.run(run_async())
        ck.ok(deltas and deltas[-1].result is not None and deltas[-1].result.text == r.text and
              "".join(d.text for d in deltas) == r.text, "AsyncClient stream: deltas add up to the same answer")
        ck.ok(st.get("ready") is True, "AsyncClient status: ready")
        # interactive chat through stdin
        p = subprocess.run([zllm_bin, "chat", "--broker", cl.clients_ep, "-n", "48", "--temp", "0"],
                           input=Q + "\n", capture_output=True, text=True, timeout=90)
        lines = [x for x in p.stdout.splitlines() if x.strip()]
        print("zllm chat: %r" % lines)
        ck.ok(p.returncode == 0 and lines and "Paris" in lines[0], "zllm chat answer mentions Paris (rc %d)" % p.returncode)
        c.close()
    finally:
        if ck.failed:
            cl.dump_logs()
        cl.close()
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
