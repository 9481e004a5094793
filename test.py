"""memo's test suite: the specification, made executable.  Run: python3 -m pytest test.py

Most tests call memo's commands in-process (SPEC section 5): spawning an
interpreter costs ~40 ms a call, and paying every nap of 2,000 memories is
~2,000 calls.  What needs real processes (the lock, the shebang, argv, exit
codes, crashes) runs the real CLI.  MEMO_SLOW=1 lengthens the crash and fuzz
loops.
"""
import contextlib
import io
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from importlib.machinery import SourceFileLoader

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MEMO = os.path.join(HERE, "memo")
sys.path.insert(0, HERE)
import blocks  # noqa: E402

memo = SourceFileLoader("memo", MEMO).load_module()
SLOW = bool(os.environ.get("MEMO_SLOW"))
DEFAULT_SIZES = dict(memo.DEFAULTS)


# ------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------

class Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    def __repr__(self):
        return "Result(%r, out=%r, err=%r)" % (self.code, self.out[-400:], self.err[-400:])


def call(d, name, *args, stdin=None):
    """Run command `name` in-process on store `d`; return its Result."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            memo.COMMANDS[name](str(d), list(args))
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdin = saved
    return Result(code, out.getvalue(), err.getvalue())


def cli(d, *args, stdin=None, env=None, timeout=60):
    """Run the real ./memo through its shebang with MEMORY_DIR=d."""
    e = dict(os.environ, MEMORY_DIR=str(d))
    e.update(env or {})
    r = subprocess.run([MEMO] + list(args), env=e, input=stdin, capture_output=True,
                       timeout=timeout)
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return Result(r.returncode, out, err)


def init(d):
    r = cli(d, "init")
    assert r.code == 0, r
    return d


def log_bytes(d):
    with open(os.path.join(d, "LOG.txt"), "rb") as f:
        return f.read()


def write_history(path, n, start=0, day="2020-01-01"):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(start, start + n):
            f.write("%s event %d happened\n" % (day, i))
    return path


def compress(prompt):
    """A deterministic stand-in for the agent: join the inputs' texts, cut."""
    texts = [m.group(1) for m in re.finditer(
        r"^  #\d+(?:-\d+)? (?:\d{4}-\d\d-\d\d )?(.*)$", prompt, re.M)]
    return " / ".join(texts).encode()[:200].decode("utf-8", "ignore").strip() or "empty"


def pay_all(d):
    """Pay every pending nap in-process; return how many were paid."""
    paid = 0
    while True:
        r = call(d, "sleep")
        assert r.code == 0, r
        if "Nothing left to compress." in r.out:
            return paid
        block = re.search(r"^Run: memo sleep (\d+-\d+) ", r.out, re.M).group(1)
        r = call(d, "sleep", block, compress(r.out))
        assert r.code == 0 and "%s saved." % block in r.out, r
        paid += 1


@pytest.fixture(autouse=True)
def default_sizes():
    """Every test starts from the tool's default sizes."""
    memo.__dict__.update(DEFAULT_SIZES)
    yield
    memo.__dict__.update(DEFAULT_SIZES)


@pytest.fixture
def store(tmp_path):
    """An empty, initialised store; MEMORY_DIR points at it for in-process calls."""
    d = tmp_path / "mem"
    init(d)
    old = os.environ.get("MEMORY_DIR")
    os.environ["MEMORY_DIR"] = str(d)
    yield str(d)
    if old is None:
        os.environ.pop("MEMORY_DIR", None)
    else:
        os.environ["MEMORY_DIR"] = old


def imported(d, tmp_path, n, **kw):
    r = call(d, "import", write_history(str(tmp_path / "h.txt"), n, **kw))
    assert r.code == 0, r
    return d


def test_smoke(store):
    assert call(store, "note", "hello").out.startswith("Saved as #0.")
