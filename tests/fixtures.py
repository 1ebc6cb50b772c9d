"""tests/fixtures.py: where the Python tests find their data. root() is $ZLLM_FIXTURES, else the folder that
tests/fetch-fixtures.sh assembles and prints (exported then as $ZLLM_FIXTURES for the processes a test starts);
path(*parts) is one file under it and raises FileNotFoundError naming the file when it is missing or empty, so a
test never compares against data it does not have. Not a test itself (run.sh only runs tests/test_*)."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def root():
    d = os.environ.get("ZLLM_FIXTURES")
    if not d:
        r = subprocess.run(["bash", os.path.join(ROOT, "tests", "fetch-fixtures.sh")], stdout=subprocess.PIPE,
                           cwd=ROOT)
        d = r.stdout.decode().strip() or "(tests/fetch-fixtures.sh failed)"
        os.environ["ZLLM_FIXTURES"] = d
    return d


def path(*parts):
    p = os.path.join(root(), *parts)
    if not os.path.isfile(p) or os.path.getsize(p) == 0:
        raise FileNotFoundError("missing test fixture: %s (tests/fetch-fixtures.sh assembles the fixtures)" % p)
    return p
