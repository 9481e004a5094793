"""memo's test suite: the specification, made executable.  Run: python3 -m pytest test.py

Most tests call memo's commands in-process (SPEC section 5): spawning an
interpreter costs ~40 ms a call, and paying every nap of 2,000 memories is
~2,000 calls.  What needs real processes (the lock, the shebang, argv, exit
codes, crashes) runs the real CLI.  MEMO_SLOW=1 lengthens the crash and fuzz
loops.
"""
import contextlib
import errno
import functools
import io
import os
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MEMO = os.path.join(HERE, "memo")
sys.path.insert(0, HERE)
import blocks  # noqa: E402



def load_memo():
    """memo as a module (it has no .py suffix); loading must not run main()."""
    spec = spec_from_loader("memo", SourceFileLoader("memo", MEMO))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


memo = load_memo()
SLOW = bool(os.environ.get("MEMO_SLOW"))
DEFAULT_SIZES = dict(memo.DEFAULTS)

# The shebang runs `python3` from PATH: put the interpreter running the tests
# first, so real processes start fast and run the same Python.
PYDIR = os.path.dirname(sys.executable)
BASE_ENV = dict(os.environ, PATH=PYDIR + os.pathsep + os.environ.get("PATH", ""))
BASE_ENV.pop("NO_COLOR", None)

LOG, TREE = 320, 288
DAY = "2020-01-01"


# ------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------

class Result:
    def __init__(self, code, out, err, raw=b""):
        self.code, self.out, self.err, self.raw = code, out, err, raw

    def __repr__(self):
        return "Result(%r, out=%r, err=%r)" % (self.code, self.out[-600:], self.err[-600:])


def call(d, name, *args, stdin=None):
    """Run command `name` in-process on store `d`; return its Result."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved = sys.stdin
    if stdin is not None:
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            memo.COMMANDS[name](str(d), list(args))
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdin = saved
    return Result(code, out.getvalue(), err.getvalue())


def env_for(d, env=None):
    e = dict(BASE_ENV, MEMORY_DIR=str(d))
    e.update(env or {})
    return e


def cli(d, *args, stdin=None, env=None, timeout=60, preexec_fn=None, prefix=()):
    """Run the real memo through its shebang with MEMORY_DIR=d; no traceback allowed."""
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8")
    r = subprocess.run(list(prefix) + [MEMO] + list(args), env=env_for(d, env), input=stdin,
                       capture_output=True, timeout=timeout, preexec_fn=preexec_fn)
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return Result(r.returncode, out, err, r.stdout)


def rec(i, text, date=DAY):
    """Memory record i, written by hand (not by memo)."""
    return ("#%d %s %s" % (i, date, text)).encode("utf-8").ljust(LOG - 1) + b"\n"


def srec(text):
    """A summary record, written by hand."""
    return text.encode("utf-8").ljust(TREE - 1) + b"\n"


def write(path, data, mode=0o600):
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def paid_tree(T):
    """Every summary complete at T, so nothing is pending."""
    tree, size = {}, 2
    while size <= T:
        tree[size] = ["sum %d-%d" % (k * size, (k + 1) * size - 1) for k in range(T // size)]
        size *= 2
    return tree


def make_store(d, texts=(), tree=None, date=DAY):
    """A store written by hand: LOG.txt of `texts`, TREE levels from `tree`."""
    d = str(d)
    os.makedirs(d, mode=0o700)
    os.chmod(d, 0o700)
    write(os.path.join(d, "LOG.txt"), b"".join(rec(i, t, date) for i, t in enumerate(texts)))
    os.mkdir(os.path.join(d, "TREE"), 0o700)
    for size, texts in (tree or {}).items():
        write(os.path.join(d, "TREE", str(size)), b"".join(srec(t) for t in texts))
    return d


def log_bytes(d):
    with open(os.path.join(str(d), "LOG.txt"), "rb") as f:
        return f.read()


RECORD = re.compile(rb"#(\d+) (\d{4}-\d\d-\d\d) ?(.*?) *\n\Z", re.S)


def records(d, torn_ok=False):
    """The texts of LOG.txt, asserting it is aligned and every id is its position."""
    data = log_bytes(d)
    if not torn_ok:
        assert len(data) % LOG == 0, "LOG.txt misaligned: %d bytes" % len(data)
    texts = []
    for i in range(len(data) // LOG):
        m = RECORD.match(data[i * LOG:(i + 1) * LOG])
        assert m and int(m.group(1)) == i, "record %d: %r" % (i, data[i * LOG:i * LOG + 40])
        texts.append(m.group(3).decode("utf-8"))
    return texts


def tree_sizes(d):
    """{size: records} for every TREE level, asserting each is aligned."""
    out = {}
    tree = os.path.join(str(d), "TREE")
    for name in os.listdir(tree):
        n = os.path.getsize(os.path.join(tree, name))
        assert n % TREE == 0, "TREE/%s misaligned: %d bytes" % (name, n)
        out[int(name)] = n // TREE
    return out


def tree_levels(d):
    """{size: summaries} counting whole records, less a trailing zero-filled tail
    (crash debris, as SPEC section 2 defines it)."""
    out = {}
    tree = os.path.join(str(d), "TREE")
    for name in os.listdir(tree):
        with open(os.path.join(tree, name), "rb") as f:
            data = f.read()
        n = len(data) // TREE
        while n and b"\0" in data[(n - 1) * TREE:n * TREE]:
            n -= 1
        out[int(name)] = n
    return out


def tree_consistent(d):
    """Every built summary's halves are built: a level never outruns the one below."""
    levels = tree_levels(d)
    for size, n in levels.items():
        if size > 2 and n:
            assert levels.get(size // 2, 0) >= 2 * n, "TREE/%d has %d but TREE/%d has %d" % (
                size, n, size // 2, levels.get(size // 2, 0))


def one_line(text):
    return len(text.strip().splitlines()) == 1


def read_terminal(fd):
    """Everything written to a pseudo-terminal's other end, until it closes."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other end is closed
            return out
        if not chunk:
            return out
        out += chunk


def init(d):
    r = cli(d, "init")
    assert r.code == 0, r
    return d


def write_history(path, n, start=0, day="2020-01-01"):
    with open(str(path), "w", encoding="utf-8") as f:
        for i in range(start, start + n):
            f.write("%s event %d happened\n" % (day, i))
    return str(path)


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



# ------------------------------------------------------------------------
# blocks.py
# ------------------------------------------------------------------------

BUDGETS = [1, 2, 3, 5, 8, 16, 17, 31, 64, 208]
SAMPLES = list(range(0, 300)) + [511, 512, 513, 1023, 1024, 2000, 4097, 65535,
                                 65536, 10 ** 6, 2 ** 31 - 1, 10 ** 9]


def slow_cover(T, budget):
    """cover's rule, slowly and exactly: from roots(T), split the block with
    the largest size/age (Fraction, no floats), the newest on a tie, until
    the budget is spent.  This is SPEC section 3's alpha rule (split while
    size > alpha * age, alpha falling), spending the last splits by ratio."""
    from fractions import Fraction
    c = blocks.roots(T)
    while len(c) < min(budget, T):
        k = max((i for i, (lo, hi) in enumerate(c) if hi - lo > 1),
                key=lambda i: (Fraction(c[i][1] - c[i][0], T - c[i][0]), c[i][0]))
        c[k:k + 1] = list(blocks.halves(*c[k]))
    return c


@pytest.mark.parametrize("T", SAMPLES)
def test_cover_properties(T):
    """cover tiles [0,T) oldest first with aligned blocks, spends the budget,
    never coarsens toward the present, and uses only buildable blocks."""
    done = set(blocks.complete(T)) if T <= 5000 else None
    for budget in BUDGETS:
        c = blocks.cover(T, budget)
        assert c[0][0] == 0 if T else c == []
        assert all(a[1] == b[0] for a, b in zip(c, c[1:]))
        assert not c or c[-1][1] == T
        assert all(blocks.is_block(lo, hi) for lo, hi in c)
        sizes = [hi - lo for lo, hi in c]
        assert sizes == sorted(sizes, reverse=True), "detail must grow toward now"
        if T <= budget:
            assert sizes == [1] * T, "under budget every memory is verbatim"
        else:
            assert len(c) == max(budget, bin(T).count("1"))
        if done is not None:
            assert all((lo, hi) in done for lo, hi in c if hi - lo > 1)


@pytest.mark.parametrize("T", list(range(1, 200)) + [1000, 4097])
def test_cover_matches_the_slow_rule(T):
    """The heap (floats) picks exactly the blocks the slow exact rule picks."""
    for budget in (1, 2, 4, 7, 12, 30, 64):
        assert blocks.cover(T, budget) == slow_cover(T, budget), budget


def test_cover_detail_goes_to_the_newest():
    c = blocks.cover(10 ** 6, 208)
    assert c[-1] == (10 ** 6 - 1, 10 ** 6) and c[0][1] - c[0][0] > 1


@pytest.mark.parametrize("T", list(range(0, 300)) + [4096, 10 ** 4 + 7])
def test_complete_order_and_count(T):
    """complete(T): every complete block of size >= 2, by hi then size, each
    after its halves; complete_count agrees; a new memory adds one block
    per trailing zero bit of T."""
    c = blocks.complete(T)
    every = {(lo, lo + s) for s in (2 ** k for k in range(1, 20)) for lo in range(0, T - s + 1, s)}
    assert set(c) == every and len(c) == len(every)
    assert c == sorted(c, key=lambda b: (b[1], b[1] - b[0]))
    place = {b: i for i, b in enumerate(c)}
    for lo, hi in c:
        if hi - lo > 2:
            assert all(place[h] < place[(lo, hi)] for h in blocks.halves(lo, hi))
    assert blocks.complete_count(T) == len(c)
    if T:
        added = blocks.completed_at(T)
        assert added == [b for b in c if b[1] == T]
        assert len(added) == (T & -T).bit_length() - 1
        assert len(added) <= 16 or T >= 2 ** 17


def test_complete_count_is_cheap_at_a_billion():
    T = 10 ** 9
    assert blocks.complete_count(T) == sum(T >> k for k in range(1, 31))


@pytest.mark.parametrize("lo,hi,ok", [
    (0, 1, True), (0, 2, True), (16, 32, True), (4, 8, True), (1, 3, False),
    (3, 5, False), (17, 33, False), (0, 3, False), (8, 8, False), (-2, 0, False)])
def test_is_block(lo, hi, ok):
    assert blocks.is_block(lo, hi) is ok


# ------------------------------------------------------------------------
# Records and the store's bytes
# ------------------------------------------------------------------------

def test_records_are_fixed_width_and_multibyte_safe(store):
    """Memory i is the 320-byte record at 320*i, cut as bytes: a multi-byte
    text never shifts a later record."""
    texts = ["ã" * 140, "日本語のテキスト" * 11, "plain", "→ ção 🎉"]
    for i, text in enumerate(texts):
        assert call(store, "note", text).out.startswith("Saved as #%d." % i)
    raw = log_bytes(store)
    assert len(raw) == 320 * len(texts)
    for i, text in enumerate(texts):
        rec = raw[320 * i:320 * (i + 1)]
        head = ("#%d %s " % (i, memo.today())).encode()
        assert rec.startswith(head) and rec.endswith(b"\n")
        assert rec[len(head):-1].rstrip(b" ").decode() == text
    pay_all(store)
    assert "#3 %s → ção 🎉" % memo.today() in call(store, "wake").out


def test_summary_records_are_fixed_width(store, tmp_path):
    imported(store, tmp_path, 4)
    assert call(store, "sleep", "0-1", "ãã first pair").code == 0
    with open(os.path.join(store, "TREE", "2"), "rb") as f:
        rec = f.read()
    assert len(rec) == 288 and rec.endswith(b"\n") and rec.rstrip() == "ãã first pair".encode()


@pytest.mark.parametrize("text,why", [
    ("ã" * 150, "Too long: 300 bytes, limit 280."),
    ("x" * 281, "Too long: 281 bytes, limit 280."),
    ("", "Empty"),
    ("   ", "Empty"),
    ("two\nlines", "one line"),
    ("two\rlines", "one line"),
    ("a\u2028b", "U+2028"),
    ("a\x1b[31mred", "U+001B"),
    ("a\u202eb", "U+202E"),
    ("tab\there", "U+0009"),
])
def test_note_refuses_bad_text(store, text, why):
    r = call(store, "note", text)
    assert r.code == 1 and why in r.err and "Saved" not in r.out, r
    assert log_bytes(store) == b""


def test_note_accepts_exactly_the_limit(store):
    assert call(store, "note", "ã" * 140).code == 0  # 280 bytes
    assert call(store, "note", "  padded  ").code == 0
    assert log_bytes(store)[320:].startswith(("#1 %s padded " % memo.today()).encode())


def test_config_overrides_and_errors(store):
    path = os.path.join(store, "config")
    assert "# WAKE_LINES = 208" in open(path).read(), "init writes every size commented out"
    with open(path, "a") as f:
        f.write("ENTRY_CHARS = 20  # short\n")
    memo.config(store)
    assert memo.ENTRY_CHARS == 20 and memo.WAKE_LINES == 208
    assert "limit 20" in call(store, "note", "x" * 21).err
    for line, why in [("FOO = 3", "line 9"), ("WAKE_LINES = -1", "positive"),
                      ("WAKE_LINES = 1.5", "positive"), ("ENTRY_CHARS = 300", "at most 280"),
                      ("WAKE_LINES", "NAME = value")]:
        with open(path, "w") as f:
            f.write("# x\n" * 8 + line + "\n")
        r = cli(store, "wake")
        assert r.code == 1 and path in r.err and why in r.err, (line, r)


# ------------------------------------------------------------------------
# The scheduler, wake and sleep
# ------------------------------------------------------------------------

def test_a_full_life_of_2000_memories(store, tmp_path):
    """Import 2,000 dated memories, pay every nap with a stand-in compressor:
    exactly len(complete(2000)) naps, then wake pages as SPEC says."""
    imported(store, tmp_path, 2000)
    T = 2000
    assert memo.pending_count(store, T) == len(blocks.complete(T))
    assert memo.pending(store, T) == blocks.complete(T)
    r = call(store, "wake")
    assert r.code == 1 and r.out.startswith(
        "Cannot wake: %d compressions pending. Do them, then run memo wake again." % 1994)
    assert pay_all(store) == len(blocks.complete(T))
    assert memo.pending_count(store, T) == 0 and memo.pending(store, T) == []
    check_wake(store, T, "2020-01-01 event 1999 happened")


def check_wake(d, T, newest):
    """Every part fits every harness, orders the next, and the last says awake."""
    lines, k = [], 1
    while True:
        r = call(d, "wake", str(k), str(T)) if k > 1 else call(d, "wake")
        assert r.code == 0, r
        assert len(r.out) < 30000 and len(r.out.encode()) <= memo.PART_CHARS
        assert r.out.count("\n") <= min(2000, memo.PART_LINES)
        body = r.out.splitlines()
        lines += [l for l in body if l.startswith("#")]
        if body[-1] == "You are awake.":
            break
        assert body[0].startswith("Your memory, part %d of " % k)
        assert body[-1] == "Run: memo wake %d %d" % (k + 1, T)
        k += 1
    assert len(lines) == min(T, memo.WAKE_LINES)
    assert lines[-1] == "#%d %s" % (T - 1, newest)
    assert [l.split()[0] for l in lines] == [
        "#%d" % lo if hi - lo == 1 else "#%d-%d" % (lo, hi - 1)
        for lo, hi in blocks.cover(T, memo.WAKE_LINES)]
    return k


def test_wake_snapshot_is_stable(store, tmp_path):
    """A note and a paid nap between `wake 1 T` calls change nothing."""
    imported(store, tmp_path, 600)
    pay_all(store)
    memo.PART_CHARS = 6000
    first = call(store, "wake", "1", "600").out
    second = call(store, "wake", "2", "600").out
    assert "part 1 of" in first
    call(store, "note", "something new")
    r = call(store, "note", "and another")  # completes block 600-601
    assert "Compress memories #600-601" in r.out
    call(store, "sleep", "600-601", "two new things")
    assert call(store, "wake", "1", "600").out == first
    assert call(store, "wake", "2", "600").out == second


@pytest.mark.parametrize("args,why", [
    (["1", "999"], "Start over"), (["9", "10"], "Start over"), (["0"], "whole number"),
    (["x"], "whole number"), (["1", "2", "3"], "Usage: memo wake")])
def test_wake_bad_part_or_T(store, tmp_path, args, why):
    imported(store, tmp_path, 10)
    pay_all(store)
    r = call(store, "wake", *args)
    assert r.code == 1 and why in r.err, r


def test_wake_counts_pending_as_of_T(store, tmp_path):
    """Levels may hold more than an older T needs: never a negative count."""
    imported(store, tmp_path, 64)
    pay_all(store)
    for T in range(1, 65):
        assert memo.pending_count(store, T) == 0
        assert call(store, "wake", "1", str(T)).code == 0


def test_wake_empty_and_missing(store, tmp_path):
    r = call(store, "wake")
    assert r.code == 0 and "No memories yet." in r.out and r.out.endswith("You are awake.\n")
    missing = str(tmp_path / "typo")
    r = cli(missing, "wake")
    assert r.code == 1 and "No memory at %s." % missing in r.err and "memo init" in r.err
    assert not os.path.exists(missing)


def test_one_pending_and_the_prompt(store, tmp_path):
    imported(store, tmp_path, 2)
    r = call(store, "wake")
    assert r.out.startswith("Cannot wake: 1 compression pending. Do it, then run memo wake again.")
    assert "None" not in r.out
    assert "  #0 2020-01-01 event 0 happened\n  #1 2020-01-01 event 1 happened" in r.out
    assert "0 compressions remain after this one." in r.out
    assert r.out.rstrip().endswith('Run: memo sleep 0-1 "<your line>"')


def test_big_block_prompt_shows_two_halves(store, tmp_path):
    imported(store, tmp_path, 32)
    while True:
        r = call(store, "sleep")
        if "#0-31 into" in r.out:
            break
        block = re.search(r"Run: memo sleep (\S+) ", r.out).group(1)
        call(store, "sleep", block, "summary of " + block)
    assert "\n  #0-15 summary of 0-15\n  #16-31 summary of 16-31\n" in r.out


def test_sleep_settled_wrong_and_idle(store, tmp_path):
    imported(store, tmp_path, 4)
    r = call(store, "sleep", "2-3", "too early")
    assert r.code == 1 and "Wrong block: 2-3." in r.err and "0-1" in r.err
    assert "Run: memo sleep" in r.err
    assert call(store, "sleep", "0-1", "pair").out.startswith("0-1 saved.")
    r = call(store, "sleep", "0-1", "pair again")
    assert r.code == 0 and r.out.startswith("0-1 is already settled.")
    assert "Compress memories #2-3" in r.out, "then the next nap"
    pay_all(store)
    r = call(store, "sleep", "4-5", "nothing there")
    assert r.code == 0 and "Nothing left to compress." in r.out
    assert os.path.getsize(os.path.join(store, "TREE", "2")) == 2 * 288
    r = call(store, "sleep")
    assert r.code == 0 and r.out == "Nothing left to compress.\n"
    for out in (call(store, "sleep").out, call(store, "sleep", "0-1", "x").out):
        assert "You are awake." not in out


@pytest.mark.parametrize("bid", ["1-2", "3-4", "17-32", "5-5", "0-2", "abc", "-1-2", "1e3-2"])
def test_sleep_rejects_non_blocks_before_lookup(store, bid):
    r = call(store, "sleep", bid, "text")
    assert r.code == 1 and r.err and "Traceback" not in r.err


def test_sleep_validates_the_line(store, tmp_path):
    imported(store, tmp_path, 2)
    r = call(store, "sleep", "0-1", "x" * 300)
    assert r.code == 1 and "Too long: 300 bytes, limit 280." in r.err
    r = call(store, "sleep", "0-1", "a\nb")
    assert r.code == 1 and "one line" in r.err
    assert not os.path.exists(os.path.join(store, "TREE", "2")) or \
        os.path.getsize(os.path.join(store, "TREE", "2")) == 0


def test_note_shows_the_nap_it_causes(store):
    assert call(store, "note", "one").out == "Saved as #0.\n"
    r = call(store, "note", "two")
    assert r.out.startswith("Saved as #1.\nCompress memories #0-1 into one line")


def test_forget_one_summary_says_just_that(store, tmp_path):
    """Bug it pins (an agent trial): forgetting the only summary said it
    also dropped "the summaries built on it, and every later summary"."""
    imported(store, tmp_path, 3)
    pay_all(store)
    assert call(store, "forget", "0-1").out == "Forgot 1 summary: 0-1.\nRun: memo sleep\n"


def test_forget_and_rebuild(store, tmp_path):
    imported(store, tmp_path, 40)
    pay_all(store)
    sizes = {n: os.path.getsize(os.path.join(store, "TREE", n))
             for n in os.listdir(os.path.join(store, "TREE"))}
    r = call(store, "forget", "16-23")
    # 16-23, 24-31 and 32-39 at level 8, 16-31 at 16, 0-31 at 32
    assert r.out == ("Forgot 5 summaries: 16-23, and the 4 of size 8 and up built on it "
                     "or after it.\nRun: memo sleep\n"), r
    assert memo.pending_count(store, 40) == 5
    log = log_bytes(store)
    assert pay_all(store) == 5
    assert log_bytes(store) == log
    assert sizes == {n: os.path.getsize(os.path.join(store, "TREE", n))
                     for n in os.listdir(os.path.join(store, "TREE"))}


@pytest.mark.parametrize("bid,why", [("17-32", "Not a block"), ("abc", "block id"),
                                     ("64-127", "no summary"), ("3-4", "Not a block")])
def test_forget_errors(store, tmp_path, bid, why):
    imported(store, tmp_path, 8)
    pay_all(store)
    r = call(store, "forget", bid)
    assert r.code == 1 and why in r.err, r


# ------------------------------------------------------------------------
# recall
# ------------------------------------------------------------------------

def test_recall_matches_the_whole_line(store, tmp_path):
    imported(store, tmp_path, 30)
    r = call(store, "recall", "^#7 ")
    assert r.out == "#7 2020-01-01 event 7 happened\n1 match.\n"
    assert call(store, "recall", "2020-01-01").out.endswith("30 matches.\n")
    assert call(store, "recall", "EVENT 2[89]").out.splitlines()[-1] == "2 matches."
    assert call(store, "recall", "nothing like this").out == "No match.\n"


def test_recall_caps_its_output(store, tmp_path):
    imported(store, tmp_path, 400)
    memo.PART_CHARS = 2000
    r = call(store, "recall", "event")
    lines = r.out.splitlines()
    assert len(r.out.encode()) <= 2000
    k = len(lines) - 1
    assert lines[-1] == "Newest %d of 400 matches. Narrow the regex." % k
    assert lines[-2] == "#399 2020-01-01 event 399 happened"


def test_recall_bad_regex(store):
    r = call(store, "recall", "(")
    assert r.code == 1 and "Bad regex" in r.err


# ------------------------------------------------------------------------
# import
# ------------------------------------------------------------------------

@pytest.mark.parametrize("content,why", [
    (b"2020-01-01 ok\n2020-02-30 impossible\n", "line 2"),
    (b"2020-01-02 ok\n2020-01-01 earlier\n", "line 2"),
    (b"2020-01-01 ok\n\n2020-01-01 " + b"x" * 281 + b"\n", "line 3"),
    (b"2020-01-01 ok\n2020-01-01\n", "line 2"),
    (b"2020-01-01 ok\n2020-01-01    \n", "line 2"),
    (b"2020-01-01 caf\xe9\n", "line 1"),
    (b"01/02/2020 us date\n", "line 1"),
    (b"2020-1-2 short date\n", "line 1"),
    (b"2020-01-01 a\x1bb\n", "line 1"),
    (b"2020-01-01 a\xe2\x80\xa8b\n", "U+2028"),
    (b"\n\n", "holds no memories"),
])
def test_import_refuses_bad_files_whole(store, tmp_path, content, why):
    imported(store, tmp_path, 1, day="2019-12-31")
    before = log_bytes(store)
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    r = call(store, "import", str(path))
    assert r.code == 1 and why in r.err, r
    assert log_bytes(store) == before


def test_import_refuses_dates_before_the_store(store, tmp_path):
    imported(store, tmp_path, 3, day="2021-05-05")
    path = write_history(str(tmp_path / "old.txt"), 2, day="2021-05-04")
    r = call(store, "import", path)
    assert r.code == 1 and "line 1" in r.err and "newest memory" in r.err
    assert r.err.endswith("memo only appends. To put this history first, import it into a "
                          "new, empty store, then import there what memo export prints here.\n")


def test_import_ok_with_bom_crlf_and_blank_lines(store, tmp_path):
    path = tmp_path / "h.txt"
    path.write_bytes(b"\xef\xbb\xbf2020-01-01 first\r\n\r\n  \n2020-01-03 second\n2020-01-03 third")
    r = call(store, "import", str(path))
    assert r.code == 0, r
    assert r.out == ("Imported 3 memories, #0 to #2.\n1 compression pending.\n"
                     "Run: memo sleep\n")
    assert call(store, "recall", "^#2 ").out.startswith("#2 2020-01-03 third\n")


BACKLOG_HINT = ("That many are best paid unattended: your user can run memo sleep "
                "--exec (see memo help sleep).\n")


@pytest.mark.parametrize("n, naps", [(66, 64), (68, 66)])
def test_backlog_hint_past_64_naps(store, tmp_path, n, naps):
    """Past BACKLOG (64) naps, import and wake both say how to pay them
    unattended.  (From an agent trial: import said only `Run: memo sleep`,
    while the agent block says to tell the user about thousands.)"""
    r = call(store, "import", write_history(str(tmp_path / "h.txt"), n))
    hint = BACKLOG_HINT if naps > 64 else ""
    assert r.out.endswith("\n%d compressions pending.\n%sRun: memo sleep\n" % (naps, hint)), r
    w = call(store, "wake")
    assert w.code == 1 and w.out.startswith(
        "Cannot wake: %d compressions pending. Do them, then run memo wake again.\n%s\n"
        "Compress memories #0-1 " % (naps, hint)), w


@pytest.mark.parametrize("name", ["h.txt", "my history.txt", "-"])
def test_import_too_long_says_how_to_cut(store, tmp_path, name):
    """A too-long line names the cut that fits every line (an agent trial
    met it with no fix offered), for the file as the shell needs it."""
    path = tmp_path / ("stdin.txt" if name == "-" else name)
    path.write_bytes(b"2020-01-01 ok\n2020-01-02 " + "é".encode() * 141 + b"\n")
    if name == "-":
        r = cli(store, "import", "-", stdin=path.read_bytes())
        shown_path = "<file>"
    else:
        r = call(store, "import", str(path))
        shown_path = str(path) if " " not in name else "'%s'" % path
    assert r.code == 1 and r.err == (
        "%s line 2: Too long: 282 bytes, limit 280. Shorten it, or cut every line to fit: "
        "cut -b1-291 %s | iconv -c -f utf-8 -t utf-8 > clean.txt\n"
        % ("-" if name == "-" else path, shown_path)), r


def test_import_missing_and_directory(store, tmp_path):
    for path in (str(tmp_path / "nope.txt"), str(tmp_path)):
        r = call(store, "import", path)
        assert r.code == 1 and path in r.err


# ------------------------------------------------------------------------
# Real processes: the shebang, argv, exit codes, the lock
# ------------------------------------------------------------------------

def test_shebang_usage_help_and_version_need_no_store(tmp_path):
    nowhere = tmp_path / "none"
    r = cli(nowhere)
    assert r.code == 0 and "Usage: memo <command>" in r.out
    for args in (["--help"], ["help"], ["help", "note"], ["note", "--help"],
                 ["sleep", "-h"], ["--version"]):
        r = cli(nowhere, *args)
        assert r.code == 0 and r.out.strip(), args
    assert "Usage: memo note" in cli(nowhere, "help", "note").out
    assert cli(nowhere, "--version").out.startswith("memo ")
    assert not nowhere.exists()


@pytest.mark.parametrize("args,why", [
    (["frobnicate"], "Unknown command: frobnicate."),
    (["note"], "Usage: memo note"),
    (["note", "a", "b"], "Usage: memo note"),
    (["note", "-x"], "put -- before it"),
    (["sleep", "0-1"], "Usage: memo sleep"),
    (["recall"], "Usage: memo recall"),
    (["wake", "--max-bytes"], "needs a value"),
    (["wake", "--max-bytes", "abc"], "whole number"),
    (["zoom", "1-2"], "Not a block"),
    (["forget"], "Usage: memo forget"),
    (["import"], "Usage: memo import"),
    (["export", "x"], "Usage: memo export"),
    (["help", "nope"], "Unknown command: nope."),
])
def test_usage_errors_exit_1_in_one_message(store, args, why):
    r = cli(store, *args)
    assert r.code == 1 and why in r.err and r.out == "", (args, r)
    assert log_bytes(store) == b""


def test_note_dash_dash_saves_the_literal(store):
    r = cli(store, "note", "--", "--help")
    assert r.code == 0 and "Saved as #0." in r.out
    assert log_bytes(store).startswith(("#0 %s --help " % memo.today()).encode())


def test_missing_store_is_never_created(tmp_path):
    d = tmp_path / "typo"
    for args in (["note", "x"], ["sleep"], ["recall", "x"], ["import", "f"],
                 ["forget", "0-1"], ["zoom", "0-1"], ["export"], ["verify"], ["wake"]):
        r = cli(d, *args)
        assert r.code == 1 and "No memory at" in r.err, args
    assert not d.exists()


def test_init_is_idempotent_with_a_temporary_home(tmp_path):
    env = {"HOME": str(tmp_path), "MEMORY_DIR": ""}
    r = cli("", "init", env=env)
    d = tmp_path / "memory"
    assert r.code == 0 and "Created %s." % d in r.out
    assert "## Memory" in r.out and "You are a subagent. Don't run memo." in r.out
    block = r.out[r.out.index("## Memory"):]
    with open(os.path.join(HERE, "AGENTS.md.example"), encoding="utf-8") as f:
        assert f.read() == block, "AGENTS.md.example is init's block for the default paths"
    assert sorted(os.listdir(d)) == ["LOG.txt", "TREE", "config"]
    cli("", "note", "kept", env=env)
    config = (d / "config").read_bytes()
    r = cli("", "init", env=env)
    assert r.code == 0 and "Found %s: 1 memory." % d in r.out and "## Memory" in r.out
    assert (d / "config").read_bytes() == config


def test_an_empty_directory_is_a_valid_store(tmp_path):
    d = tmp_path / "bare"
    d.mkdir()
    assert cli(d, "wake").code == 0
    assert cli(d, "note", "first").code == 0
    assert len(log_bytes(str(d))) == 320


def test_symlink_on_path_finds_blocks(store, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(MEMO, bin_dir / "memo")
    env = dict(os.environ, MEMORY_DIR=store, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))
    r = subprocess.run(["memo", "note", "via a symlink"], env=env, capture_output=True,
                       text=True, cwd=str(tmp_path))
    assert r.returncode == 0 and "Saved as #0." in r.stdout, r.stderr


def test_sixteen_parallel_notes_get_distinct_ids(store):
    env = dict(os.environ, MEMORY_DIR=store)
    procs = [subprocess.Popen([MEMO, "note", "parallel %d" % k], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for k in range(16)]
    ids = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        ids.append(int(re.search(rb"Saved as #(\d+)\.", out).group(1)))
    assert sorted(ids) == list(range(16))
    raw = log_bytes(store)
    assert len(raw) == 16 * 320
    texts = {raw[320 * i:320 * i + 320].split(b" ", 2)[2].rstrip() for i in range(16)}
    assert texts == {b"parallel %d" % k for k in range(16)}


def test_torn_trailing_record_is_repaired_by_the_next_note(store):
    cli(store, "note", "whole")
    with open(os.path.join(store, "LOG.txt"), "ab") as f:
        f.write(b"#1 2020-01-01 half a rec")
    assert "No match." in cli(store, "recall", "half").out
    r = cli(store, "note", "after the crash")
    assert r.code == 0 and "Saved as #1." in r.out
    raw = log_bytes(store)
    assert len(raw) == 640 and raw[320:].startswith(b"#1 ") and b"half" not in raw


# ------------------------------------------------------------------------
# zoom, wake --max-bytes, sleep --exec, export, verify, the terminal
# ------------------------------------------------------------------------

def test_zoom_opens_a_block(store, tmp_path):
    imported(store, tmp_path, 40)
    call(store, "sleep", "0-1", "pair zero")
    assert call(store, "zoom", "0-1").out == ("#0 2020-01-01 event 0 happened\n"
                                              "#1 2020-01-01 event 1 happened\n")
    assert call(store, "zoom", "0-3").out == "#0-1 pair zero\n#2-3 not compressed yet\n"
    pay_all(store)
    out = call(store, "zoom", "0-31").out
    assert out.startswith("#0-15 event 0 happened") and "\n#16-31 " in out
    for bid, why in [("0-63", "beyond"), ("40-41", "beyond"), ("1-2", "Not a block")]:
        r = call(store, "zoom", bid)
        assert r.code == 1 and why in r.err, bid


def test_wake_max_bytes_fits_one_part(store, tmp_path):
    imported(store, tmp_path, 2000)
    pay_all(store)
    previous = 0
    for cap in (1, 500, 3000, 9000, 20000, 200000):
        r = call(store, "wake", "--max-bytes", str(cap))
        assert r.code == 0 and r.out.endswith("You are awake.\n")
        assert "part" not in r.out.splitlines()[0]
        lines = [l for l in r.out.splitlines() if l.startswith("#")]
        assert len(lines) >= bin(2000).count("1"), "never fewer than the coarsest cover"
        if cap >= 3000:
            assert len(r.out.encode()) <= cap
            assert lines[-1].startswith("#1999 "), "the newest memory verbatim"
        assert len(lines) >= previous and len(lines) <= memo.WAKE_LINES
        previous = len(lines)
    assert previous == memo.WAKE_LINES


def test_wake_max_bytes_is_the_finest_that_fits(store, tmp_path):
    """The one-pass search equals rendering every budget and keeping the
    largest that fits (the slow walk it replaces)."""
    imported(store, tmp_path, 300)
    pay_all(store)
    memo.WAKE_LINES = 60
    with memo.open_store(store) as st:
        def rendered(budget):
            lines = memo.wake_lines(st, blocks.cover(300, budget))
            return len(("Your memory, oldest first.\n%s\nYou are awake.\n"
                        % "\n".join(lines)).encode())
        for cap in (2500, 4000, 6000, 9000):
            fits = [b for b in range(bin(300).count("1"), 61) if rendered(b) <= cap]
            want = blocks.cover(300, max(fits))
            fixed = len("Your memory, oldest first.\nYou are awake.\n")
            assert memo.fitted_cover(st, 300, cap, fixed) == want, cap


def test_sleep_exec_pays_everything(store, tmp_path):
    """README's deterministic stand-in pays every nap through the real CLI."""
    imported(store, tmp_path, 100)
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    shell = re.search(r"""^    memo sleep --exec "(sed .*)"$""", readme, re.M).group(1)
    r = cli(store, "sleep", "--exec", shell)
    assert r.code == 0 and "Paid 97 compressions" in r.out, r
    assert memo.pending_count(store, 100) == 0
    assert cli(store, "wake").code == 0


@pytest.mark.parametrize("command,why", [
    ("exit 3", "exited with status 3"),
    ("cat >/dev/null; echo", "refused"),
    ("cat >/dev/null; printf 'x%.0s' $(seq 300)", "Too long"),
])
def test_sleep_exec_stops_cleanly(store, tmp_path, command, why):
    imported(store, tmp_path, 8)
    call(store, "sleep", "0-1", "paid by hand")
    r = cli(store, "sleep", "--exec", command)
    assert r.code == 1 and why in r.err and "Stopped at 2-3" in r.err, r
    assert memo.pending_count(store, 8) == 6
    assert call(store, "zoom", "0-3").out.startswith("#0-1 paid by hand\n")


def test_sleep_exec_stops_cleanly_on_ctrl_c(store, tmp_path):
    imported(store, tmp_path, 4)
    # the first nap is paid at once; the second waits, saying so, for Ctrl-C
    first, second = tmp_path / "first", tmp_path / "second"
    # (a Ctrl-C landing while the shell starts `sleep` can miss it: then its
    # stderr must not hold our pipe open, and it is killed at the end)
    command = ("cat >/dev/null; if [ -e {0} ]; then touch {1}; sleep 30 2>/dev/null; fi; "
               "touch {0}; echo sum".format(first, second))
    # a shell's background job ignores SIGINT; a terminal's foreground one does not
    p = subprocess.Popen([MEMO, "sleep", "--exec", command],
                         env=env_for(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not second.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        out, err = p.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and b"Stopped by Ctrl-C: 1 compression saved." in err, err
    assert b"Traceback" not in err and memo.pending_count(store, 4) == 2
    assert call(store, "verify").code == 0


def test_sleep_exec_shows_progress_only_on_a_terminal(store, tmp_path):
    import pty
    imported(store, tmp_path, 8)
    master, slave = pty.openpty()
    p = subprocess.Popen([MEMO, "sleep", "--exec", "cat >/dev/null; echo sum"],
                         env=env_for(store), stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out, _ = p.communicate(timeout=60)
    err = read_terminal(master)
    os.close(master)
    assert p.returncode == 0 and b"Paid 7 compressions" in out
    assert re.search(rb"7/7 compressions, [0-9.]+/s, \d+s left", err), err
    piped = cli(store, "sleep", "--exec", "cat")
    assert piped.err == "" and "Paid 0 compressions" in piped.out


def test_export_then_import_reproduces_the_log(store, tmp_path):
    imported(store, tmp_path, 50)
    call(store, "note", "ã → ção, with \"quotes\" and $dollars")
    out = call(store, "export").out
    assert out.splitlines()[0] == "2020-01-01 event 0 happened"
    dump = tmp_path / "dump.txt"
    dump.write_text(out, encoding="utf-8")
    other = init(tmp_path / "other")
    assert cli(other, "import", str(dump)).code == 0
    assert log_bytes(str(other)) == log_bytes(store)


def test_verify_healthy_and_sick(store, tmp_path):
    imported(store, tmp_path, 20)
    r = call(store, "verify")
    assert r.code == 0 and r.out.startswith("OK: 20 memories, 0 summaries, 18 compressions")
    pay_all(store)
    assert call(store, "verify").out == "OK: 20 memories, 18 summaries, 0 compressions pending.\n"
    with open(os.path.join(store, "LOG.txt"), "r+b") as f:
        f.seek(320 * 5)
        f.write(b"#9")
    with open(os.path.join(store, "TREE", "4"), "r+b") as f:
        f.seek(288)
        f.write(b"\xff\xfe")
    with open(os.path.join(store, "LOG.txt"), "ab") as f:
        f.write(b"#20 torn")
    os.chmod(store, 0o755)
    r = call(store, "verify")
    assert r.code == 1
    assert "memory #5" in r.out.lower() and "Fix:" in r.out
    assert "memo forget 4-7" in r.out
    assert "chmod -R go-rwx" in r.out and "unfinished write" in r.out
    assert log_bytes(store)[320 * 5:320 * 5 + 2] == b"#9", "verify writes nothing"


def test_verify_keeps_the_fix_command_verbatim(store, tmp_path):
    """Regression: verify passed its lines through str.capitalize, which
    lowered `Fix:` and `UTF-8` in the middle of the line."""
    imported(store, tmp_path, 8)
    pay_all(store)
    with open(os.path.join(store, "TREE", "2"), "r+b") as f:
        f.seek(288 * 2)
        f.write(b"\xff")
    r = call(store, "verify")
    assert r.code == 1 and "Summary 4-5 is not valid UTF-8. Fix: memo forget 4-5" in r.out


def test_verify_finds_summaries_without_halves(store, tmp_path):
    imported(store, tmp_path, 64)
    pay_all(store)
    os.truncate(os.path.join(store, "TREE", "16"), 288)  # 16-31 and 32-47 gone
    r = call(store, "verify")
    assert r.code == 1 and "TREE/32 holds 2 summaries" in r.out and "memo forget 0-31" in r.out


def test_recall_highlights_only_on_a_terminal(store):
    import pty
    call(store, "note", "the Flask decision")
    env = dict(os.environ, MEMORY_DIR=store)
    env.pop("NO_COLOR", None)
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(MEMO, [MEMO, "recall", "flask"], env)
    out = read_terminal(fd)
    os.waitpid(pid, 0)
    assert b"\x1b[1;31mFlask\x1b[0m" in out
    piped = cli(store, "recall", "flask")
    assert "\x1b" not in piped.out and "the Flask decision" in piped.out


# ------------------------------------------------------------------------
# Regressions from agent trials
# ------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["<your line>", "<one line>", " <your line> ",
                                  "<YOUR LINE>", '"<your line>"', "<your summary>",
                                  "<your line> webhooks use HMAC-SHA256"])
def test_placeholders_are_refused(store, tmp_path, text):
    """Regression: an agent that ran `Run: memo sleep 2-3 "<your line>"`
    verbatim saved the blank itself as the summary."""
    imported(store, tmp_path, 2)
    for args in (["note", text], ["sleep", "0-1", text]):
        r = call(store, *args)
        assert r.code == 1 and "blank to fill" in r.err, args
    assert memo.pending_count(store, 2) == 1


def test_missing_store_gives_no_init_order(tmp_path):
    """Regression: `Run: memo init` under `No memory at` led an agent obeying
    Run: lines to create a second, empty identity on a MEMORY_DIR typo."""
    r = cli(tmp_path / "typo", "note", "x")
    assert "memo init" in r.err and "Run:" not in r.err + r.out


def test_import_reads_a_pipe(store):
    """Regression: `memo import <(sort ...)` failed, since a pipe cannot be
    read twice (once to check, once to write)."""
    r = cli(store, "import", "/dev/stdin", stdin=b"2020-01-01 from a pipe\n2020-01-02 two\n")
    assert r.code == 0 and "Imported 2 memories, #0 to #1." in r.out, r
    r = cli(store, "import", "-", stdin=b"2020-01-03 from stdin\n")
    assert r.code == 0 and "#2 to #2" in r.out, r


def test_agent_slips_get_a_way_out(store, tmp_path):
    """Regressions from an agent trial: the `#` the prompt prints before a
    block id, unquoted words, and `memo help help`."""
    imported(store, tmp_path, 4)
    r = call(store, "sleep", "#0-1", "the first pair")
    assert r.code == 0 and r.out.startswith("0-1 saved.")
    r = call(store, "sleep", "2-3", "Dana", "masks", "IBANs")
    assert r.code == 1 and "quote it" in r.err
    r = call(store, "recall", "Dana", "IBAN")
    assert r.code == 1 and "quote it" in r.err
    r = call(store, "sleep", "1-2", "x")
    assert r.code == 1 and "Not a block: 1-2." in r.err and "Run: memo sleep" in r.err
    r = call(store, "sleep", "-1-0", "x")
    assert r.code == 1 and "put --" not in r.err
    assert call(store, "note", "<a href> is fine inside a longer text").code == 0
    assert call(store, "note", "Escape <text> and <line> in templates").code == 0
    assert cli(store, "help", "help").code == 0


# ------------------------------------------------------------------------
# The docs say what the code does
# ------------------------------------------------------------------------

def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    command = re.search(r"^    (v=\$\(mktemp -d\) .*pytest -q test\.py)$", readme, re.M).group(1)
    assert command in open(os.path.join(HERE, ".ci", "run")).read().splitlines()


def test_readme_guarantees_name_real_tests():
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    named = set(re.findall(r"`(test_\w+)`", readme))
    assert len(named) > 10 and all(name in globals() for name in named), \
        sorted(n for n in named if n not in globals())


def test_readme_history_recipe_cleans_real_history(tmp_path):
    """The README's sort-and-trim recipe turns the messy flask history (dates
    going backwards, subjects over 280 bytes) into an importable file."""
    src = os.path.join(HERE, "..", "shared", "data", "flask-commits.txt")
    if not os.path.exists(src):
        pytest.skip("no ../shared/data here")
    clean = tmp_path / "clean.txt"
    subprocess.run("sort -s -k1,1 %s | cut -b1-291 | iconv -c -f utf-8 -t utf-8 > %s"
                   % (src, clean), shell=True, check=True)
    d = init(tmp_path / "mem")
    r = cli(d, "import", str(clean))
    assert r.code == 0 and "Imported 3806 memories" in r.out, r


# ========================================================================
# Hardening: crashes, faults, races, hostile text, fuzz, privacy
# ========================================================================

# ------------------------------------------------------------------------
# 1-2. Crash debris at the tail: zero-filled records, torn records
# ------------------------------------------------------------------------

def _shown_memories(d):
    """What each reading command shows as memories, asserting all succeed."""
    w = call(d, "wake")
    assert w.code == 0 and w.out.rstrip().endswith("You are awake."), w
    r = call(d, "recall", ".")
    assert r.code == 0, r
    e = call(d, "export")
    assert e.code == 0, e
    s = call(d, "sleep")
    assert s.code == 0 and "Nothing left to compress." in s.out, s
    return w, r, e


LOG_TAILS = {
    "one zero record": b"\0" * LOG,
    "three zero records": b"\0" * (3 * LOG),
    "zero record and zero partial": b"\0" * (LOG + 100),
    "record with zero tail": rec(3, "half written")[:200] + b"\0" * (LOG - 200),
    "record with zero head": b"\0" * 100 + rec(3, "half written")[100:],
    "record with one zero byte": rec(3, "half written")[:50] + b"\0" + rec(3, "half written")[51:],
    "torn record": rec(3, "torn write")[:40],
    "torn record missing newline": rec(3, "torn write")[:-1],
    "one torn byte": b"#",
    "zero records then torn": b"\0" * (2 * LOG) + rec(3, "torn write")[:40],
}


@pytest.mark.parametrize("tail", LOG_TAILS, ids=list(LOG_TAILS))
def test_log_debris_tail_never_shown_and_dropped_by_next_writer(tmp_path, tail):
    """A zero-filled or torn LOG.txt tail is not a memory: no reader shows it,
    nothing counts it, and the next `note` drops it and takes the next id."""
    d = make_store(tmp_path / "m", ["event 0", "event 1", "event 2"], tree=paid_tree(3))
    with open(os.path.join(d, "LOG.txt"), "ab") as f:
        f.write(LOG_TAILS[tail])
    w, r, e = _shown_memories(d)
    assert w.out.count("\n#") == 3 and "#3 " not in w.out, w
    assert "3 matches." in r.out and "written" not in r.out, r
    assert e.out.splitlines() == ["%s event %d" % (DAY, i) for i in range(3)], e
    assert "Found %s: 3 memories." % d in cli(d, "init").out
    z = call(d, "zoom", "2-3")
    assert z.code == 1, z  # block 2-3 is beyond a memory of 3
    r = call(d, "note", "after the crash")
    assert r.code == 0 and r.out.startswith("Saved as #3."), r
    assert records(d) == ["event 0", "event 1", "event 2", "after the crash"]


TREE_TAILS = {
    "zero record": b"\0" * TREE,
    "two zero records": b"\0" * (2 * TREE),
    "summary with zero tail": srec("half a summary")[:100] + b"\0" * (TREE - 100),
    "torn summary": srec("torn summary")[:30],
    "zero record then torn": b"\0" * TREE + b"torn",
}


@pytest.mark.parametrize("tail", TREE_TAILS, ids=list(TREE_TAILS))
def test_tree_debris_tail_is_not_a_summary(tmp_path, tail):
    """A zero-filled or torn TREE/<size> tail is not a summary: the block stays
    pending (`not compressed yet`), and the next sleep drops the debris."""
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree={2: ["sum 0-1"]})
    with open(os.path.join(d, "TREE", "2"), "ab") as f:
        f.write(TREE_TAILS[tail])
    w = call(d, "wake")
    assert w.code == 1 and "Cannot wake: 2 compressions pending." in w.out, w
    z = call(d, "zoom", "0-3")
    assert z.code == 0 and z.out.splitlines() == ["#0-1 sum 0-1", "#2-3 not compressed yet"], z
    s = call(d, "sleep")
    assert "Compress memories #2-3 " in s.out, s
    s = call(d, "sleep", "2-3", "sum 2-3")
    assert s.code == 0 and "2-3 saved." in s.out, s
    with open(os.path.join(d, "TREE", "2"), "rb") as f:
        assert f.read() == srec("sum 0-1") + srec("sum 2-3")
    assert call(d, "sleep", "0-3", "sum 0-3").code == 0
    assert call(d, "verify").code == 0


# ------------------------------------------------------------------------
# 3. Corruption in the middle: named, exit 1, nothing rewritten
# ------------------------------------------------------------------------

def _patch(data, offset, new):
    return data[:offset] + new + data[offset + len(new):]


TEXT_AT = len("#2 2020-01-01 ")  # first text byte of record 2
CORRUPTIONS = {
    "id changed": lambda r: _patch(r, 1, b"7"),
    "hash replaced": lambda r: _patch(r, 0, b"X"),
    "date broken": lambda r: _patch(r, 8, b"x"),
    "space after date gone": lambda r: _patch(r, TEXT_AT - 1, b"x"),
    "invalid utf-8 in text": lambda r: _patch(r, TEXT_AT + 12, b"\xff"),
    "lone utf-8 lead byte": lambda r: _patch(r, TEXT_AT + 12, b"\xc3"),
    "invalid utf-8 in padding": lambda r: _patch(r, 300, b"\xfe"),
    "newline replaced": lambda r: _patch(r, LOG - 1, b" "),
    "zero byte in text": lambda r: _patch(r, TEXT_AT + 12, b"\0"),
    "record of another id": lambda r: rec(5, "event 2 and more"),
}
READERS = [("wake",), ("recall", "event"), ("recall", "ev.nt"), ("recall", "^#2 "),
           ("export",), ("zoom", "2-3"), ("verify",)]


@pytest.mark.parametrize("how", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_corrupt_middle_memory_named_by_every_reader(tmp_path, how):
    """A middle record that is not `#<i> <date> ` with i its position, or not
    UTF-8, makes every reading command exit 1 naming memory #2 (no
    traceback, not skipped), and nothing rewrites LOG.txt."""
    d = make_store(tmp_path / "m", ["event %d and more" % i for i in range(6)],
                   tree=paid_tree(6))
    path = os.path.join(d, "LOG.txt")
    data = log_bytes(d)
    bad = data[:2 * LOG] + CORRUPTIONS[how](data[2 * LOG:3 * LOG]) + data[3 * LOG:]
    assert len(bad) == len(data) and bad != data
    with open(path, "wb") as f:
        f.write(bad)
    for args in READERS:
        r = call(d, *args)
        assert r.code == 1, (args, r)
        assert re.search(r"#2\b", r.err + r.out), (args, r)
        assert "event 2" not in r.out, (args, r)  # never shown as if it were fine
        assert log_bytes(d) == bad, args
    r = cli(d, "wake")  # the real process too: exit 1, no traceback
    assert r.code == 1 and "#2" in r.err, r
    assert log_bytes(d) == bad


def test_corrupt_memory_in_notes_nap_prompt(tmp_path):
    """`note` whose nap prompt shows a corrupt memory reports it by id, exit 1;
    the bytes already in LOG.txt stay as they were."""
    d = make_store(tmp_path / "m", ["event 0", "event 1", "event 2"])
    data = log_bytes(d)
    bad = _patch(data, len("#0 2020-01-01 e"), b"\xff")
    with open(os.path.join(d, "LOG.txt"), "wb") as f:
        f.write(bad)
    r = call(d, "note", "a new one")
    assert r.code == 1 and re.search(r"#0\b", r.err), r
    after = log_bytes(d)
    assert after[:len(bad)] == bad
    if "Saved as #3." in r.out:
        assert len(after) == 4 * LOG and after[3 * LOG:].startswith(b"#3 ")
    else:
        assert after == bad
    s = call(d, "sleep")
    assert s.code == 1 and "#0" in s.err, s


SUMMARY_CORRUPTIONS = {
    "invalid utf-8": lambda r: _patch(r, 2, b"\xff"),
    "zero byte": lambda r: _patch(r, 2, b"\0"),
    "blank": lambda r: b" " * (TREE - 1) + b"\n",
    "newline replaced": lambda r: _patch(r, TREE - 1, b"x"),
}


@pytest.mark.parametrize("how", SUMMARY_CORRUPTIONS, ids=list(SUMMARY_CORRUPTIONS))
def test_corrupt_summary_names_block_and_forget(tmp_path, how):
    """A damaged TREE summary (not the level's last record): wake, zoom and
    verify name block 0-1 and `memo forget 0-1`; forgetting and re-sleeping heals."""
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=paid_tree(4))
    path = os.path.join(d, "TREE", "2")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(SUMMARY_CORRUPTIONS[how](data[:TREE]) + data[TREE:])
    memo.WAKE_LINES = 2  # wake shows 0-1 and 2-3 as summaries
    w = call(d, "wake")
    assert w.code == 1 and "0-1" in w.err and "Run: memo forget 0-1" in w.err, w
    z = call(d, "zoom", "0-3")
    assert z.code == 1 and "memo forget 0-1" in z.err, z
    v = call(d, "verify")
    assert v.code == 1 and "memo forget 0-1" in v.out, v
    assert call(d, "forget", "0-1").code == 0
    pay_all(d)
    assert call(d, "wake").code == 0
    assert call(d, "verify").code == 0


def test_raw_newline_inside_a_record_is_one_line_everywhere(tmp_path):
    """A hand-written record holding a raw LF inside its text is still one
    memory: wake, export and recall (literal and regex) show it on one line
    with U+FFFD, under its own id, and the memory after it is unharmed."""
    d = make_store(tmp_path / "m", ["foo\nbar", "baz", "qux"], tree=paid_tree(3))
    expect = ["#0 %s foo\ufffdbar" % DAY, "#1 %s baz" % DAY]
    w = call(d, "wake")
    assert w.code == 0 and expect[0] in w.out.splitlines(), w
    e = call(d, "export")
    assert e.code == 0 and e.out.splitlines()[0] == "%s foo\ufffdbar" % DAY, e
    for pattern in ("ba", "ba[rz]", "b.r|baz"):
        r = call(d, "recall", pattern)
        assert r.code == 0 and r.out.splitlines() == expect + ["2 matches."], (pattern, r)


# ------------------------------------------------------------------------
# 4. Crashes: all or nothing, acknowledged means kept
# ------------------------------------------------------------------------

def _reader_count(d):
    e = call(d, "export")
    assert e.code == 0, e
    return len(e.out.splitlines())


def test_import_sigkill_loop_all_or_nothing(tmp_path):
    """`memo import` SIGKILLed at a random moment: readers then see the
    count before or after the whole import, never part of it; the next
    writer leaves LOG.txt aligned with every id at its position."""
    rnd = random.Random(20240601)
    n = 1000
    hist = write_history(tmp_path / "h.txt", n)
    d = str(tmp_path / "m")
    make_store(d, ["old"])
    t0 = time.monotonic()
    r = subprocess.run([MEMO, "import", hist], env=env_for(d), capture_output=True)
    span = (time.monotonic() - t0) * 1.2
    assert r.returncode == 0, r
    stats = {"killed": 0, "rolled back": 0, "done": 0}
    for it in range(100 * (15 if SLOW else 1)):
        shutil.rmtree(d)
        k = rnd.randrange(0, 4)
        make_store(d, ["old %d" % i for i in range(k)])
        p = subprocess.Popen([MEMO, "import", hist], env=env_for(d),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if it % 2:
            time.sleep(rnd.uniform(0, span))
        else:  # aim at the append: wait for the import's journal, then a little more
            journal, limit = os.path.join(d, ".journal"), time.monotonic() + span
            while not os.path.exists(journal) and time.monotonic() < limit:
                pass
            time.sleep(rnd.uniform(0, 0.004))
        p.kill()
        out, err = p.communicate()
        assert b"Traceback" not in err, err
        done = b"Imported %d memories" % n in out
        stats["killed" if p.returncode else "done"] += 1
        if os.path.exists(os.path.join(d, ".journal")) and os.path.getsize(
                os.path.join(d, "LOG.txt")) > k * LOG:
            stats["rolled back"] += 1
        seen = _reader_count(d)
        assert seen in (k, k + n), (it, seen, k)
        if done:
            assert seen == k + n
        r = call(d, "note", "after") if it % 4 else cli(d, "note", "after")
        assert r.code == 0 and r.out.startswith("Saved as #%d." % seen), r
        texts = records(d)
        assert len(texts) == seen + 1 and texts[-1] == "after"
    print("import kill loop:", stats)


def test_note_bursts_sigkill_loop(tmp_path):
    """Bursts of `memo note` processes SIGKILLed at random: every note that
    printed `Saved as #i.` is memory #i, and whole records are never damaged."""
    rnd = random.Random(77)
    d = make_store(tmp_path / "m")
    claimed = {}
    for b in range(35 * (15 if SLOW else 1)):
        procs = []
        for j in range(4):
            text = "burst %d %d" % (b, j)
            p = subprocess.Popen([MEMO, "note", text], env=env_for(d),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # a burst of 4 is done by ~0.07 s on 2 cores: kills spread past that
            procs.append((rnd.uniform(0.0, 0.09), p, text))
        start = time.monotonic()
        for at, p, text in sorted(procs, key=lambda x: x[0]):
            time.sleep(max(0.0, start + at - time.monotonic()))
            p.kill()
        for at, p, text in procs:
            out, err = p.communicate()
            assert b"Traceback" not in err, err
            m = re.match(rb"Saved as #(\d+)\.", out)
            if m:
                claimed[int(m.group(1))] = text
        texts = records(d, torn_ok=True)
        for i, text in claimed.items():
            assert texts[i] == text, (i, text, texts[i])
        assert _reader_count(d) == len(texts)
    r = call(d, "note", "final")
    assert r.code == 0
    texts = records(d)
    assert texts[-1] == "final"
    for i, text in claimed.items():
        assert texts[i] == text


def _steps(d, run):
    """How many write_at/sync/ftruncate calls `run()` makes on a copy of `d`."""
    count = [0]
    real = (memo.write_at, memo.sync, os.ftruncate)

    def counting(f):
        def g(*a):
            count[0] += 1
            return f(*a)
        return g
    memo.write_at, memo.sync = counting(real[0]), counting(real[1])
    memo.os.ftruncate = counting(real[2])
    try:
        run()
    finally:
        memo.write_at, memo.sync = real[0], real[1]
        memo.os.ftruncate = real[2]
    return count[0]


def _crash_at(step, mode, run):
    """Fork; in the child, die by os._exit at write step `step` (1-based):
    "before" it, "torn" (a write_at writes half its data first) or "after"."""
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            count = [0]
            real_ftruncate = os.ftruncate

            def crashing(f, is_write):
                def g(*a):
                    count[0] += 1
                    if count[0] == step:
                        if mode == "torn" and is_write:
                            fd, data, offset = a
                            os.pwrite(fd, bytes(data)[:max(1, len(data) // 2)], offset)
                        if mode == "after":
                            f(*a)
                        os._exit(137)
                    return f(*a)
                return g
            memo.write_at = crashing(memo.write_at, True)
            memo.sync = crashing(memo.sync, False)
            memo.os.ftruncate = crashing(real_ftruncate, False)
            run()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


CRASH_CASES = {
    "import": dict(before=3, cmd=("import", "HIST"), ok={3, 13}),
    "note": dict(before=3, cmd=("note", "crashing note"), ok={3, 4}),
    "sleep": dict(before=4, tree={2: ["sum 0-1"]}, cmd=("sleep", "2-3", "sum 2-3"), ok={4}),
    "forget": dict(before=8, tree="paid", cmd=("forget", "0-1"), ok={8}),
    "import onto debris": dict(before=3, debris=b"\0" * LOG + b"#3 to", cmd=("import", "HIST"),
                               ok={3, 13}),
}


@pytest.mark.parametrize("case", CRASH_CASES, ids=list(CRASH_CASES))
def test_crash_at_every_write_step(tmp_path, case):
    """A process that dies at any write_at/sync/ftruncate (before it, half
    way through a write, or just after) leaves a store that readers see as
    before or after the whole command, that the next writer repairs, whose
    TREE levels never outrun the level below, and that verifies after naps."""
    c = CRASH_CASES[case]
    hist = write_history(tmp_path / "h.txt", 10)
    args = tuple(hist if a == "HIST" else a for a in c["cmd"])
    before = c["before"]
    tree = paid_tree(before) if c.get("tree") == "paid" else c.get("tree")
    base = make_store(tmp_path / "base", ["event %d" % i for i in range(before)], tree=tree)
    if c.get("debris"):
        with open(os.path.join(base, "LOG.txt"), "ab") as f:
            f.write(c["debris"])

    def run_in(d):
        def run():
            memo.CHUNK_RECORDS = 3  # an import appends in several chunks
            call(d, *args)
        return run
    probe = str(tmp_path / "probe")
    shutil.copytree(base, probe)
    saved_chunk = memo.CHUNK_RECORDS
    try:
        steps = _steps(probe, run_in(probe))
    finally:
        memo.CHUNK_RECORDS = saved_chunk
    assert steps >= 2, steps
    for step in range(1, steps + 1):
        for mode in ("before", "torn", "after"):
            d = str(tmp_path / ("s%d%s" % (step, mode)))
            shutil.copytree(base, d)
            _crash_at(step, mode, run_in(d))
            where = (case, step, mode)
            seen = _reader_count(d)
            assert seen in c["ok"], (where, seen)
            tree_consistent_after = None
            try:
                tree_consistent(d)
            except AssertionError as e:
                tree_consistent_after = str(e)
            assert tree_consistent_after is None, (where, tree_consistent_after)
            r = call(d, "note", "next")
            assert r.code == 0 and r.out.startswith("Saved as #%d." % seen), (where, r)
            assert len(records(d)) == seen + 1
            pay_all(d)
            tree_sizes(d)
            v = call(d, "verify")
            assert v.code == 0, (where, v)
            shutil.rmtree(d)


# ------------------------------------------------------------------------
# 5. A full disk, a failing write or fsync
# ------------------------------------------------------------------------

def _fsize_limit(limit):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


DISK_FULL = {
    "note, partial record fits": dict(cmd=("note", "does not fit"), file="LOG.txt", room=100),
    "note, nothing fits": dict(cmd=("note", "does not fit"), file="LOG.txt", room=0),
    "import": dict(cmd=("import", "HIST"), file="LOG.txt", room=1000),
    "sleep, new level": dict(cmd=("sleep", "0-1", "sum 0-1"), file="TREE/2", room=50),
    "sleep, existing level": dict(cmd=("sleep", "0-3", "sum 0-3"), file="TREE/4", room=10,
                                  tree={2: ["sum 0-1", "sum 2-3"], 4: []}),
}


@pytest.mark.parametrize("case", DISK_FULL, ids=list(DISK_FULL))
def test_disk_full(tmp_path, case):
    """A write past RLIMIT_FSIZE (EFBIG, like a full disk): one-line error,
    exit 1, never `Saved`/`saved.`/`Imported`; the store stays aligned and
    the next normal command gets the right id."""
    c = DISK_FULL[case]
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=c.get("tree"))
    hist = write_history(tmp_path / "h.txt", 10)
    args = [hist if a == "HIST" else a for a in c["cmd"]]
    path = os.path.join(d, c["file"])
    size = os.path.getsize(path) if os.path.exists(path) else 0
    r = cli(d, *args, preexec_fn=_fsize_limit(size + c["room"]))
    assert r.code == 1, r
    assert one_line(r.err), r
    assert "Saved" not in r.out and "saved." not in r.out and "Imported" not in r.out, r
    assert len(records(d, torn_ok=True)) == 4
    assert _reader_count(d) == 4
    tree_sizes(d)
    r = call(d, "note", "disk has room again")
    assert r.code == 0 and r.out.startswith("Saved as #4."), r
    assert records(d)[4] == "disk has room again"
    if args[0] == "sleep":
        r = call(d, "sleep", args[1], "sum again")
        assert r.code == 0 and "%s saved." % args[1] in r.out, r
        tree_sizes(d)


def _eio(*a, **k):
    raise OSError(errno.EIO, "Input/output error")


def _half_then(code):
    def write(fd, data, offset):
        os.pwrite(fd, bytes(data)[:len(data) // 2], offset)
        raise OSError(code, os.strerror(code))
    return write


def _fail_nth(real, n):
    count = [0]

    def f(*a):
        count[0] += 1
        if count[0] == n:
            raise OSError(errno.EIO, "Input/output error")
        return real(*a)
    return f


FAULTS = {
    "write_at EIO": ("write_at", lambda real: _eio),
    "write_at half then ENOSPC": ("write_at", lambda real: _half_then(errno.ENOSPC)),
    "sync EIO": ("sync", lambda real: _eio),
    "second sync EIO": ("sync", lambda real: _fail_nth(real, 2)),
    "third sync EIO": ("sync", lambda real: _fail_nth(real, 3)),
}
FAULT_COMMANDS = {
    "note": (("note", "lost to EIO"), {4}),
    "import": (("import", "HIST"), {4, 14}),
    "sleep": (("sleep", "0-1", "sum 0-1"), {4}),
    "forget": (("forget", "0-3"), {4}),
}


@pytest.mark.parametrize("cmd", FAULT_COMMANDS, ids=list(FAULT_COMMANDS))
@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
def test_failed_write_or_fsync_is_fatal(tmp_path, monkeypatch, fault, cmd):
    """memo.write_at or memo.sync raising OSError: exit 1 with one line, no
    success message, the store aligned, and the next note gets the right id."""
    args, ok = FAULT_COMMANDS[cmd]
    tree = paid_tree(4) if cmd == "forget" else None
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=tree)
    hist = write_history(tmp_path / "h.txt", 10)
    args = [hist if a == "HIST" else a for a in args]
    name, make = FAULTS[fault]
    faulty, raised = make(getattr(memo, name)), []

    def tracked(*a):
        try:
            return faulty(*a)
        except OSError:
            raised.append(a)
            raise
    monkeypatch.setattr(memo, name, tracked)
    r = call(d, *args)
    monkeypatch.undo()
    if not raised:  # this command never reaches the faulty call: it must just work
        assert r.code == 0, r
        return
    assert r.code == 1, r
    assert one_line(r.err), r
    for word in ("Saved", "saved.", "Imported", "Forgot"):
        assert word not in r.out, r
    seen = _reader_count(d)
    assert seen in ok, (seen, r)
    tree_sizes(d)
    r = call(d, "note", "after the fault")
    assert r.code == 0 and r.out.startswith("Saved as #%d." % seen), r
    assert len(records(d)) == seen + 1


# ------------------------------------------------------------------------
# 6. A read-only or unreadable store
# ------------------------------------------------------------------------

def _unprivileged():
    """A command prefix that runs memo without root's permission override."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("running as root and no setpriv to drop CAP_DAC_OVERRIDE: "
                    "file modes cannot block root's writes")
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
    probe = subprocess.run(prefix + ["true"], capture_output=True)
    if probe.returncode:
        pytest.skip("setpriv cannot drop capabilities here: %r" % probe.stderr)
    return prefix


def _chmod_tree(d, dmode, fmode):
    for root, dirs, files in os.walk(d):
        for f in files:
            os.chmod(os.path.join(root, f), fmode)
    for root, dirs, files in os.walk(d, topdown=False):
        for x in dirs:
            os.chmod(os.path.join(root, x), dmode)
    os.chmod(d, dmode)


@pytest.mark.parametrize("with_lock", [False, True], ids=["no .lock", "read-only .lock"])
def test_read_only_store(tmp_path, with_lock):
    """A read-only store (dir 0500, files 0400): wake, recall, zoom, export
    and verify work; note, sleep and import refuse with one line, exit 1,
    and LOG.txt is unchanged."""
    prefix = _unprivileged()
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(3)], tree=paid_tree(3))
    if with_lock:
        write(os.path.join(d, ".lock"), b"")
    hist = write_history(tmp_path / "h.txt", 3)
    data = log_bytes(d)
    _chmod_tree(d, 0o500, 0o400)
    try:
        r = cli(d, "wake", prefix=prefix)
        assert r.code == 0 and "You are awake." in r.out and "#2 " in r.out, r
        r = cli(d, "recall", "event", prefix=prefix)
        assert r.code == 0 and "3 matches." in r.out, r
        r = cli(d, "zoom", "0-1", prefix=prefix)
        assert r.code == 0 and "#1 " in r.out, r
        r = cli(d, "export", prefix=prefix)
        assert r.code == 0 and len(r.out.splitlines()) == 3, r
        r = cli(d, "verify", prefix=prefix)
        assert r.code == 0, r
        for args in (("note", "cannot write"), ("import", hist), ("sleep", "2-3", "x"),
                     ("forget", "0-1")):
            r = cli(d, *args, prefix=prefix)
            assert r.code == 1 and one_line(r.err), (args, r)
            assert "Saved" not in r.out and "saved." not in r.out, (args, r)
        assert log_bytes(d) == data
    finally:
        _chmod_tree(d, 0o700, 0o600)


def test_unreadable_store(tmp_path):
    """A store its user cannot read (dir 0000): every command is one line, exit 1."""
    prefix = _unprivileged()
    d = make_store(tmp_path / "m", ["event 0"])
    os.chmod(d, 0)
    try:
        for args in (("wake",), ("recall", "x"), ("note", "x"), ("export",), ("verify",)):
            r = cli(d, *args, prefix=prefix)
            assert r.code == 1 and one_line(r.err), (args, r)
    finally:
        os.chmod(d, 0o700)


# ------------------------------------------------------------------------
# 7. Concurrency
# ------------------------------------------------------------------------

def test_64_concurrent_notes_get_distinct_ids(tmp_path):
    """64 `memo note` processes at once: ids 0..63 once each, every record
    holds the text of the process told its id, LOG.txt is 64 aligned records."""
    d = make_store(tmp_path / "m")
    procs = [subprocess.Popen([MEMO, "note", "note from %d" % k], env=env_for(d),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for k in range(64)]
    got = {}
    for k, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and b"Traceback" not in err, (out, err)
        i = int(re.match(rb"Saved as #(\d+)\.", out).group(1))
        assert i not in got
        got[i] = "note from %d" % k
    assert sorted(got) == list(range(64))
    texts = records(d)
    assert len(texts) == 64
    assert all(texts[i] == got[i] for i in range(64))


@pytest.mark.parametrize("args", [("note", "waits"), ("import", "HIST"), ("sleep", "0-1", "s"),
                                  ("forget", "2-3")], ids=lambda a: a[0])
def test_writers_wait_for_the_lock(tmp_path, args):
    """While another process holds the exclusive flock on .lock, a writer
    changes nothing and waits; once it is released the writer finishes."""
    import fcntl
    tree = None if args[0] == "sleep" else {2: ["sum 0-1", "sum 2-3"]}
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=tree)
    hist = write_history(tmp_path / "h.txt", 5)
    args = [hist if a == "HIST" else a for a in args]

    def snapshot():
        out = {}
        for base, dirs, files in os.walk(d):
            for f in files:
                with open(os.path.join(base, f), "rb") as fh:
                    out[os.path.join(base, f)] = fh.read()
        return out
    fd = os.open(os.path.join(d, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = snapshot()
        p = subprocess.Popen([MEMO] + args, env=env_for(d), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        time.sleep(0.4)
        assert p.poll() is None, p.communicate()
        assert snapshot() == before
    finally:
        os.close(fd)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and b"Traceback" not in err, (out, err)
    assert snapshot() != before


def test_same_nap_paid_by_many_at_once(tmp_path):
    """Eight processes paying nap 0-1 at once: exactly one `0-1 saved.`, the
    rest `0-1 is already settled.`, all exit 0, TREE/2 holds one summary."""
    d = make_store(tmp_path / "m", ["event 0", "event 1"])
    procs = [subprocess.Popen([MEMO, "sleep", "0-1", "summary %d" % k], env=env_for(d),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for k in range(8)]
    saved = []
    for k, p in enumerate(procs):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and not err, (out, err)
        if b"0-1 saved." in out:
            saved.append(k)
        else:
            assert b"0-1 is already settled." in out, out
    assert len(saved) == 1
    with open(os.path.join(d, "TREE", "2"), "rb") as f:
        assert f.read() == srec("summary %d" % saved[0])


def test_forget_racing_sleep_leaves_a_consistent_store(tmp_path):
    """`forget` loops racing `sleep --exec` loops: no traceback, exit codes
    0/1, and afterwards the store verifies once the remaining naps are paid."""
    rnd = random.Random(5)
    T = 64
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(T)])
    stop = time.monotonic() + (8 if SLOW else 1.5)
    problems, forgot = [], []

    def run(args):
        p = subprocess.run([MEMO] + args, env=env_for(d), capture_output=True, timeout=60)
        if b"Traceback" in p.stderr or p.returncode not in (0, 1):
            problems.append((args, p.returncode, p.stderr[-500:]))
        if args[0] == "forget" and p.returncode == 0:
            forgot.append(args)
        return p

    def sleeper():
        while time.monotonic() < stop:
            p = run(["sleep", "--exec", "echo racing summary"])
            if p.returncode:
                problems.append(("sleep --exec failed", p.stderr[-300:]))

    def forgetter(seed):
        r = random.Random(seed)
        while time.monotonic() < stop:
            size = 2 ** r.randrange(1, 7)
            lo = r.randrange(0, T // size) * size
            run(["forget", "%d-%d" % (lo, lo + size - 1)])
    threads = [threading.Thread(target=sleeper) for _ in range(2)]
    threads += [threading.Thread(target=forgetter, args=(rnd.random(),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:3]
    assert forgot, "no forget ever raced a sleep"
    tree_sizes(d)
    tree_consistent(d)
    pay_all(d)
    v = call(d, "verify")
    assert v.code == 0, v
    assert tree_sizes(d) == {s: T // s for s in (2, 4, 8, 16, 32, 64)}


# ------------------------------------------------------------------------
# 8. Hostile text: refused on the way in, U+FFFD on the way out
# ------------------------------------------------------------------------

SPLITTERS = [c for c in map(chr, range(0x3000)) if len(("a%sb" % c).splitlines()) == 2]
CONTROLS = [c for c in map(chr, list(range(0x20)) + [0x7f] + list(range(0x80, 0xa0)))
            if c not in SPLITTERS]
BIDI = [chr(c) for c in list(range(0x202a, 0x202f)) + list(range(0x2066, 0x206a))]
HOSTILE = SPLITTERS + CONTROLS + BIDI


def test_hostile_tables_are_what_the_spec_lists():
    """The tables below cover VT, FF, FS, GS, RS, NEL, U+2028/9, ESC, DEL, C1, bidi."""
    for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029":
        assert c in SPLITTERS
    for c in "\x00\x07\x08\t\x1b\x7f\x80\x9b\x9f\u202e\u2066\u2069":
        assert c in HOSTILE
    assert len(set(HOSTILE)) == 32 + 1 + 32 + 2 + 9  # C0, DEL, C1, U+2028/9, bidi


def _refusal(r, c):
    assert r.code == 1, (repr(c), r)
    assert "U+%04X" % ord(c) in r.err, (repr(c), r)
    if c in SPLITTERS:
        assert "one line" in r.err, (repr(c), r)


@pytest.mark.parametrize("c", HOSTILE, ids=["U+%04X" % ord(c) for c in HOSTILE])
def test_hostile_character_refused_by_note_sleep_import(tmp_path, c):
    """`note`, `sleep <id> <line>` and `import` refuse the character, naming it
    as U+XXXX (`one line` for a line break), and write nothing."""
    d = make_store(tmp_path / "m", ["event 0", "event 1"])
    data = log_bytes(d)
    _refusal(call(d, "note", "a%sb" % c), c)
    _refusal(call(d, "note", "-", stdin="a%sb\n" % c), c)
    _refusal(call(d, "sleep", "0-1", "a%sb" % c), c)
    assert not os.path.exists(os.path.join(d, "TREE", "2")) or \
        os.path.getsize(os.path.join(d, "TREE", "2")) == 0
    if c != "\n":  # a newline ends an import line by definition
        path = str(tmp_path / "h.txt")
        with open(path, "wb") as f:
            f.write(("2021-01-01 fine\n2021-01-02 a%sb\n" % c).encode("utf-8"))
        r = call(d, "import", path)
        _refusal(r, c)
        assert "line 2" in r.err, r
    assert log_bytes(d) == data


@pytest.mark.parametrize("c", ["\x1b", "\u2028", "\x85", "\u202e", "\x0b", "\x7f", "\x9b"],
                         ids=lambda c: "U+%04X" % ord(c))
def test_hostile_character_refused_through_argv(tmp_path, c):
    """The real CLI refuses the character in argv, naming it, exit 1."""
    d = make_store(tmp_path / "m", ["event 0", "event 1"])
    r = cli(d, "note", "a%sb" % c)
    assert r.code == 1 and "U+%04X" % ord(c) in r.err, r
    r = cli(d, "sleep", "0-1", "a%sb" % c)
    assert r.code == 1 and "U+%04X" % ord(c) in r.err, r
    assert len(records(d)) == 2


SHOWN_BAD = [c for c in HOSTILE if c not in ("\0", "\n")]  # NUL is damage, LF tested above


def _assert_clean(out, what):
    for c in SHOWN_BAD:
        assert c not in out, (what, "U+%04X" % ord(c))
    assert "\ufffd" in out, what


def test_hand_written_control_characters_shown_as_replacement(tmp_path):
    """A store written by another tool holding ESC, C1, U+2028, bidi and the
    rest (valid UTF-8, correct headers): wake, recall, zoom, export (and the
    nap prompts) print U+FFFD, never the raw character."""
    texts = ["evil %02d %s end" % (k, c) for k, c in enumerate(SHOWN_BAD)]
    T = len(texts)
    tree = paid_tree(T)
    tree[2] = ["sum %s of pair" % SHOWN_BAD[k % len(SHOWN_BAD)] for k in range(T // 2)]
    d = make_store(tmp_path / "m", texts, tree=tree)
    w = call(d, "wake")
    assert w.code == 0, w
    _assert_clean(w.out, "wake")
    assert len(w.out.splitlines()) == T + 2
    memo.WAKE_LINES = T // 2 + 1  # some summaries shown too
    w = call(d, "wake")
    assert w.code == 0 and re.search(r"^#\d+-\d+ sum \ufffd", w.out, re.M), w
    _assert_clean(w.out, "wake with summaries")
    memo.WAKE_LINES = DEFAULT_SIZES["WAKE_LINES"]
    for pattern in ("evil", "ev.l", "end$"):
        r = call(d, "recall", pattern)
        assert r.code == 0 and "%d matches." % T in r.out, (pattern, r)
        _assert_clean(r.out, "recall " + pattern)
        assert len(r.out.splitlines()) == T + 1
    e = call(d, "export")
    assert e.code == 0 and len(e.out.splitlines()) == T, e
    _assert_clean(e.out, "export")
    zooms = "".join(call(d, "zoom", "%d-%d" % (lo, lo + 1)).out for lo in range(0, T - 1, 2))
    zooms += "".join(call(d, "zoom", "%d-%d" % (lo, lo + 3)).out for lo in range(0, T - 3, 4))
    _assert_clean(zooms, "zoom")
    bare = make_store(tmp_path / "bare", texts)  # nothing paid: wake shows a nap prompt
    w = call(bare, "wake")
    assert w.code == 1 and "Cannot wake" in w.out, w
    _assert_clean(w.out, "wake's nap prompt")


# ------------------------------------------------------------------------
# 9. stdin keeps text literal
# ------------------------------------------------------------------------

LITERAL = "cost $HOME and `rm -rf x` then 'single' \"double\" \\n $(date) !!"


def test_note_and_sleep_read_stdin_literally(tmp_path):
    """`memo note -` and `memo sleep <id> -` (real processes) save stdin's text
    as is: $, backticks, quotes and backslashes kept; the heredoc's final
    newline stripped."""
    d = make_store(tmp_path / "m", ["event 0"])
    r = cli(d, "note", "-", stdin=LITERAL + "\n")
    assert r.code == 0 and r.out.startswith("Saved as #1."), r
    assert records(d)[1] == LITERAL
    r = cli(d, "sleep", "0-1", "-", stdin=LITERAL + "\n")
    assert r.code == 0 and "0-1 saved." in r.out, r
    with open(os.path.join(d, "TREE", "2"), "rb") as f:
        assert f.read() == srec(LITERAL)
    r = cli(d, "recall", "rm -rf")
    assert r.code == 0 and LITERAL in r.out, r
    r = cli(d, "note", "-", stdin="two\nlines\n")
    assert r.code == 1 and "one line" in r.err and len(records(d)) == 2


# ------------------------------------------------------------------------
# 10. A runaway regex is stopped
# ------------------------------------------------------------------------

# memo in a real process, its recall budget cut to 1 s (RECALL_SECONDS is 5)
QUICK_ALARM = ("import sys; from importlib.machinery import SourceFileLoader; "
               "from importlib.util import module_from_spec, spec_from_loader; "
               "spec = spec_from_loader('memo', SourceFileLoader('memo', sys.argv[1])); "
               "memo = module_from_spec(spec); spec.loader.exec_module(memo); "
               "memo.RECALL_SECONDS = 1; memo.main(sys.argv[2:])")


def test_runaway_regex_stopped_even_with_sigalrm_blocked_or_ignored(tmp_path):
    """`recall '(a+)+$'` on 40 a's then b stops at RECALL_SECONDS with a
    message, exit 1, no traceback: normally, with SIGALRM blocked, and
    ignored.  (A process of its own: signal dispositions are per process.)"""
    assert memo.RECALL_SECONDS == 5  # as README says
    d = make_store(tmp_path / "m", ["a" * 40 + "b"])

    def blocked():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})

    def ignored():
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
    runs = {}
    start = time.monotonic()
    for name, pre in (("plain", None), ("blocked", blocked), ("ignored", ignored)):
        runs[name] = subprocess.Popen([sys.executable, "-S", "-c", QUICK_ALARM, MEMO,
                                       "recall", "(a+)+$"], env=env_for(d),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      preexec_fn=pre)
    for name, p in runs.items():
        try:
            out, err = p.communicate(timeout=max(0.5, start + 10 - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail("recall with SIGALRM %s ran past 10 s" % name)
        assert p.returncode == 1, (name, out, err)
        assert b"Traceback" not in err and one_line(err.decode()), (name, err)
        assert err.startswith(b"Stopped after 1 s: the regex '(a+)+$' takes too long"), (
            name, err)
    assert time.monotonic() - start < 10


# ------------------------------------------------------------------------
# 11. Any locale: output is UTF-8
# ------------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    dict(LANG="C", LC_ALL="C", PYTHONIOENCODING="latin-1"),
    dict(LANG="C", LC_ALL="C", PYTHONIOENCODING="latin-1", PYTHONUTF8="0"),
    dict(LANG="C", LC_ALL="POSIX", PYTHONIOENCODING="ascii", PYTHONUTF8="0"),
], ids=["C latin-1", "C latin-1 no utf8 mode", "POSIX ascii"])
def test_c_locale_latin1_output_is_utf8(tmp_path, env):
    """Under LANG=C/LC_ALL=C and PYTHONIOENCODING=latin-1, notes holding `→`
    and `ção` are saved and shown by wake, recall and export: exit 0, UTF-8 bytes."""
    d = make_store(tmp_path / "m")
    r = cli(d, "note", "arrow → here", env=env)
    assert r.code == 0, r
    r = cli(d, "note", "-", stdin="ação ção\n", env=env)
    assert r.code == 0 and "Compress memories #0-1" in r.out and "→" in r.out, r
    r = cli(d, "sleep", "0-1", "→ and ção", env=env)
    assert r.code == 0 and "0-1 saved." in r.out, r
    assert records(d) == ["arrow → here", "ação ção"]
    for args, want in ((("wake",), "→"), (("recall", "ção"), "ação ção"),
                       (("recall", "→"), "arrow → here"), (("export",), "ação")):
        r = cli(d, *args, env=env)
        assert r.code == 0, (args, r)
        text = r.raw.decode("utf-8")  # strict: the bytes are UTF-8
        assert want in text, (args, text)


# ------------------------------------------------------------------------
# 12. Bad input never gives a traceback (targeted cases, then fuzz)
# ------------------------------------------------------------------------

HUGE = "9" * 5000  # past Python's 4300-digit int() limit
BAD_ARGV = {
    "wake huge part": ("wake", HUGE),
    "wake huge T": ("wake", "1", HUGE),
    "wake huge max-bytes": ("wake", "--max-bytes", HUGE),
    "recall huge repeat": ("recall", "a{99999999999}"),
    "recall deep nesting": ("recall", "(" * 1200 + "a" + ")" * 1200),
    "recall bad escape": ("recall", "\\"),
    "recall lookbehind": ("recall", "(?<=a)b"),
    "sleep huge block": ("sleep", "0-1152921504606846975", "x"),
    "zoom huge block": ("zoom", "0-1152921504606846975"),
    "forget huge block": ("forget", "0-1152921504606846975"),
    "import a directory": ("import", "/"),
    "import /dev/null": ("import", "/dev/null"),
    "note only dashes": ("note", "--", "--"),
    "sleep one arg": ("sleep", "0-1"),
    "wake part 0": ("wake", "0"),
}


@functools.lru_cache()
def old_python():
    """A Python 3.6 to run memo with, if this machine has one, or None."""
    import glob
    is_36 = "import sys; assert sys.version_info[:2] == (3, 6)"
    for python in [shutil.which("python3.6")] + glob.glob(
            os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")):
        try:
            if python and subprocess.run([python, "-c", is_36], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL).returncode == 0:
                return python
        except OSError:
            pass
    return None


@pytest.mark.skipif(not old_python(), reason="no Python 3.6 here")
def test_python_too_old_is_one_line(tmp_path):
    """Bug it pins: under Python 3.6, `memo recall` died with a traceback
    (bytes.isascii is 3.7's).  Now any command says what it needs."""
    r = subprocess.run([old_python(), MEMO, "wake"], env=env_for(str(tmp_path)),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr == b"memo needs Python 3.7 or later; python3 here is 3.6. " \
                       b"Install a newer Python 3.\n"


@pytest.mark.parametrize("case", BAD_ARGV, ids=list(BAD_ARGV))
def test_bad_argv_never_a_traceback(tmp_path, case):
    """Odd argv through the real CLI: exit 0 or 1, never a traceback."""
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=paid_tree(4))
    r = cli(d, *BAD_ARGV[case])
    assert r.code in (0, 1), r
    assert r.code == 0 or r.err.strip(), r


def test_note_stdin_closed_is_a_clear_error(tmp_path):
    """`memo note -` with stdin closed (fd 0 shut): exit 1, a message, no traceback."""
    d = make_store(tmp_path / "m")
    r = cli(d, "note", "-", preexec_fn=lambda: os.close(0))
    assert r.code == 1 and r.err.strip(), r
    assert log_bytes(d) == b""


BAD_STORES = {
    "journal of 5000 digits": (".journal", HUGE.encode()),
    "journal of garbage": (".journal", b"\xff\xfe not a number"),
    "journal negative": (".journal", b"-320\n"),
    "config value of 5000 digits": ("config", ("WAKE_LINES = %s\n" % HUGE).encode()),
    "config garbage": ("config", b"\xff\x00=\n= 3\nWAKE_LINES = -1\n"),
    "config unknown name": ("config", b"SIZE = 3\n"),
    "config ENTRY_CHARS too big": ("config", b"ENTRY_CHARS = 281\n"),
    "TREE name with leading zero": ("TREE/016", b""),
    "TREE name superscript two": ("TREE/\u00b2", b""),
    "TREE name arabic digit": ("TREE/\u0668", srec("x")),
    "TREE name not a power of two": ("TREE/3", srec("x")),
    "TREE level a directory": ("TREE/2/", None),
    "LOG.txt a directory": ("LOG.txt/", None),
    "TREE a file": ("TREE", b"not a dir"),
    "config a directory": ("config/", None),
    "LOG.txt random bytes": ("LOG.txt", bytes(random.Random(3).randrange(256) for _ in range(999))),
    "TREE level too long": ("TREE/2", srec("x") * 9),
}
STORE_COMMANDS = [("wake",), ("wake", "--max-bytes", "200"), ("note", "x"), ("sleep",),
                  ("sleep", "0-1", "y"), ("recall", "e"), ("recall", "e.e"), ("zoom", "0-3"),
                  ("forget", "0-1"), ("export",), ("verify",), ("init",)]


@pytest.mark.parametrize("case", BAD_STORES, ids=list(BAD_STORES))
def test_bad_store_bytes_never_a_traceback(tmp_path, case):
    """Any bytes or file types in the store: every command exits 0 or 1 with
    a message, never a traceback (real processes, config applied)."""
    d = make_store(tmp_path / "m", ["event %d" % i for i in range(4)], tree=paid_tree(4))
    name, data = BAD_STORES[case]
    path = os.path.join(d, *name.rstrip("/").split("/"))
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    if name.endswith("/"):
        os.mkdir(path, 0o700)
    else:
        write(path, data)
    # all at once: the store's lock orders the writers, and the test halves
    procs = [(args, subprocess.Popen([MEMO] + list(args), env=env_for(d),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))
             for args in STORE_COMMANDS]
    for args, p in procs:
        out, err = (b.decode("utf-8", "replace") for b in p.communicate(timeout=60))
        assert "Traceback" not in err, (args, err)
        assert p.returncode in (0, 1), (args, out, err)
        assert p.returncode == 0 or (err + out).strip(), (args, out, err)


def _listing(root, skip):
    out = set()
    for base, dirs, files in os.walk(root):
        if os.path.abspath(base).startswith(os.path.abspath(skip)):
            continue
        for x in dirs + files:
            p = os.path.join(base, x)
            if not os.path.abspath(p).startswith(os.path.abspath(skip)):
                out.add((p, os.path.getsize(p) if os.path.isfile(p) else -1))
    return out


SAFE_EXEC = ["true", "echo fuzz summary", "exit 3", "printf '\\033[2J x\\n'", "echo",
             "printf 'line one\\nline two\\n'", "head -c 3"]


def _fuzz_string(rnd):
    kind = rnd.random()
    if kind < 0.25:
        return "".join(chr(rnd.randrange(32, 127)) for _ in range(rnd.randrange(0, 12)))
    pools = [(0x1, 0x20), (0x20, 0x7f), (0x7f, 0xa0), (0xa0, 0x800), (0x2000, 0x2070),
             (0xdc80, 0xdd00), (0x4e00, 0x4e40), (0x1f600, 0x1f650)]
    out = []
    for _ in range(rnd.choice([1, 3, 10, 40, 150, 300])):
        lo, hi = rnd.choice(pools)
        out.append(chr(rnd.randrange(lo, hi)))
    return "".join(out)


def _fuzz_argv(rnd, paths):
    commands = list(memo.USAGE) + ["help", "--help", "-h", "--version", "-V", "version",
                                   "", "bogus", "WAKE", "-"]
    tokens = ["0-1", "2-3", "0-3", "4-7", "0-7", "16-31", "1-2", "3-4", "0-0", "5", "-1",
              "0-18446744073709551615", "999999999999999999-999999999999999999",
              "0", "1", "2", "3", "10", "999999999", "1e3", "\u0663",
              "--", "-", "-h", "--help", "--max-bytes", "--max-bytes=10", "--max-bytes=0",
              "--exec", "--exec=true", "-x", "--frob", "(", "a|", ".*", "^#1 ", "[",
              "(?i)x", "\\", "a{2,1}", "(?<=a)b", "\\Z", "", " ", "ã" * 150, "x" * 281,
              "2021-01-01 text"] + paths
    argv = [rnd.choice(commands)] if rnd.random() < 0.95 else []
    for _ in range(rnd.choice([0, 1, 1, 2, 2, 3, 4])):
        argv.append(rnd.choice(tokens) if rnd.random() < 0.6 else _fuzz_string(rnd))
    for i, a in enumerate(argv):  # --exec only ever runs a harmless command
        if a == "--exec" and i + 1 < len(argv):
            argv[i + 1] = rnd.choice(SAFE_EXEC)
    return argv


def _corrupt(rnd, d):
    what = rnd.randrange(9)
    log = os.path.join(d, "LOG.txt")
    rbytes = lambda n: bytes(rnd.randrange(256) for _ in range(n))  # noqa: E731
    if what == 0 and os.path.isfile(log):
        with open(log, "ab") as f:
            f.write(rnd.choice([b"\0" * LOG, rbytes(rnd.randrange(1, 700)), rec(0, "x")]))
    elif what == 1 and os.path.isfile(log) and os.path.getsize(log):
        with open(log, "r+b") as f:
            f.seek(rnd.randrange(os.path.getsize(log)))
            f.write(rbytes(rnd.randrange(1, 4)))
    elif what == 2 and os.path.isfile(log):
        with open(log, "r+b") as f:
            f.truncate(rnd.randrange(os.path.getsize(log) + 1))
    elif what == 3 and os.path.isdir(os.path.join(d, "TREE")):
        name = rnd.choice(["2", "4", "8", "16", "3", "x", "02"])
        write(os.path.join(d, "TREE", name),
              rnd.choice([srec("fuzz"), rbytes(rnd.randrange(0, 600)), b"\0" * TREE]))
    elif what == 4:
        write(os.path.join(d, "config"), rnd.choice([
            b"", rbytes(40), b"WAKE_LINES = 3\n", b"PART_LINES = 4\nPART_CHARS = 300\n",
            b"ENTRY_CHARS = 20\n", b"WAKE_LINES = 0\n"]))
    elif what == 5:
        write(os.path.join(d, ".journal"), rnd.choice([rbytes(6), b"0\n", b"%d\n" % LOG, b""]))
    elif what == 6:
        for name in (".journal", "config"):
            if os.path.exists(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
    elif what == 7:
        tree = os.path.join(d, "TREE")
        if os.path.isdir(tree):
            for name in os.listdir(tree):
                if rnd.random() < 0.5 and os.path.isfile(os.path.join(tree, name)):
                    os.remove(os.path.join(tree, name))
    else:
        pass  # leave the store alone


def test_fuzz_in_process_and_cli(tmp_path, monkeypatch):
    """Thousands of random argv lists, stdin bytes and store bytes (seeded):
    in-process only SystemExit(0/1) ever escapes memo.main; through the real
    CLI exit 0/1 and no traceback; nothing is written outside the store."""
    rnd = random.Random(1234)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    good = write_history(inputs / "good.txt", 20)
    junk = str(inputs / "junk.bin")
    with open(junk, "wb") as f:
        f.write(bytes(rnd.randrange(256) for _ in range(3000)))
    bom = str(inputs / "bom.txt")
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf2021-02-01 with a bom\r\n\r\n2021-02-02 crlf\r\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    d = str(tmp_path / "store")
    paths = [good, junk, bom, str(inputs), "/dev/null", "does-not-exist",
             os.path.join(d, "LOG.txt")]
    make_store(d, ["seed %d" % i for i in range(5)])
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("MEMORY_DIR", d)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    before = _listing(str(tmp_path), d)
    failures = []
    n = 5000 * (10 if SLOW else 1)
    for k in range(n):
        if k % 40 == 0:
            _corrupt(rnd, d)
        if os.path.isfile(os.path.join(d, "LOG.txt")) and \
                os.path.getsize(os.path.join(d, "LOG.txt")) > 300 * LOG or \
                not os.path.isdir(d):
            shutil.rmtree(d, ignore_errors=True)
            make_store(d, ["seed %d" % i for i in range(5)])
        argv = _fuzz_argv(rnd, paths)
        stdin = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 5, 50]))) \
            if rnd.random() < 0.5 else _fuzz_string(rnd).encode("utf-8", "surrogateescape")
        saved = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                memo.main(argv)
        except SystemExit as e:
            if e.code not in (0, 1, None):
                failures.append(("exit %r" % e.code, argv))
        except BaseException as e:  # noqa: B902 - anything else is a bug
            failures.append(("%s: %s" % (type(e).__name__, str(e)[:80]), argv))
        finally:
            sys.stdin = saved
            memo.__dict__.update(DEFAULT_SIZES)
    for k in range(40 * (10 if SLOW else 1)):
        if k % 5 == 0:
            _corrupt(rnd, d)
        if not os.path.isdir(d):
            make_store(d, ["seed %d" % i for i in range(5)])
        argv = [os.fsencode(a) for a in _fuzz_argv(rnd, paths)]
        stdin = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 5, 50])))
        r = subprocess.run([MEMO] + argv, env=env_for(d, {"HOME": str(tmp_path / "home")}),
                           input=stdin, capture_output=True, cwd=str(cwd), timeout=60)
        if b"Traceback" in r.stderr or r.returncode not in (0, 1):
            failures.append(("cli exit %d %r" % (r.returncode, r.stderr[-200:]), argv))
    after = _listing(str(tmp_path), d)
    assert after == before, (after ^ before)
    distinct = {}
    for why, argv in failures:
        distinct.setdefault(why.split(":")[0], (why, argv))
    assert not failures, "%d failures, e.g. %r" % (len(failures), list(distinct.values())[:6])


# ------------------------------------------------------------------------
# 13. Privacy
# ------------------------------------------------------------------------

def _umask022():
    os.umask(0o022)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private(d):
    for base, dirs, files in os.walk(d):
        assert _mode(base) == 0o700, base
        for f in files:
            assert _mode(os.path.join(base, f)) == 0o600, os.path.join(base, f)


def test_store_files_are_private_under_umask_022(tmp_path):
    """With umask 022: init makes the dir 0700 and its files 0600; files made
    later (.lock, TREE/<n>, .journal, LOG.txt and TREE/ in an empty dir) are
    0600 / 0700; wake says nothing about permissions."""
    d = str(tmp_path / "m")
    r = cli(d, "init", preexec_fn=_umask022)
    assert r.code == 0, r
    assert _mode(d) == 0o700
    for name in os.listdir(d):
        p = os.path.join(d, name)
        assert _mode(p) == (0o700 if os.path.isdir(p) else 0o600), name
    for text in ("one", "two"):
        assert cli(d, "note", text, preexec_fn=_umask022).code == 0
    assert cli(d, "sleep", "0-1", "sum", preexec_fn=_umask022).code == 0
    assert _mode(os.path.join(d, ".lock")) == 0o600
    assert _mode(os.path.join(d, "TREE", "2")) == 0o600
    hist = write_history(tmp_path / "h.txt", 5)

    def full():
        _umask022()
        _fsize_limit(os.path.getsize(os.path.join(d, "LOG.txt")) + 10)()
    r = cli(d, "import", hist, preexec_fn=full)
    assert r.code == 1, r
    _assert_private(d)  # whatever the failed import left (.journal) is private too
    r = cli(d, "wake", preexec_fn=_umask022)
    assert r.code == 0 and r.err == "", r
    e = str(tmp_path / "empty")
    os.mkdir(e, 0o700)
    assert cli(e, "note", "a", preexec_fn=_umask022).code == 0
    assert cli(e, "note", "b", preexec_fn=_umask022).code == 0
    assert cli(e, "sleep", "0-1", "s", preexec_fn=_umask022).code == 0
    assert _mode(os.path.join(e, "LOG.txt")) == 0o600
    assert _mode(os.path.join(e, "TREE")) == 0o700
    assert _mode(os.path.join(e, "TREE", "2")) == 0o600
    _assert_private(d)
    _assert_private(e)


@pytest.mark.parametrize("files", [False, True], ids=["dir 0755", "dir 0755 files 0644"])
def test_shared_store_gets_one_line_warning(tmp_path, files):
    """A store chmod'ed 0755: `wake` warns on stderr in one line naming
    `chmod -R go-rwx`, and still wakes (exit 0, stdout unchanged)."""
    d = make_store(tmp_path / "m", ["event 0"])
    quiet = cli(d, "wake")
    assert quiet.err == ""
    os.chmod(d, 0o755)
    if files:
        os.chmod(os.path.join(d, "LOG.txt"), 0o644)
    r = cli(d, "wake")
    assert r.code == 0 and r.out == quiet.out, r
    assert one_line(r.err) and "chmod -R go-rwx" in r.err, r


# ========================================================================
# Speed paths, each pinned to the simple path's answers
# ========================================================================

def test_fold_partners():
    """FOLD_PARTNERS is every non-ASCII character re.IGNORECASE folds onto
    an ASCII one: the literal fast path relies on there being no other."""
    ascii_alnum = re.compile("[a-z0-9]", re.IGNORECASE)
    found = {}
    for c in range(0x80, 0x110000):
        if ascii_alnum.fullmatch(chr(c)):
            a = next(a for a in "abcdefghijklmnopqrstuvwxyz0123456789"
                     if re.fullmatch(a, chr(c), re.IGNORECASE))
            found.setdefault(a.encode(), []).append(chr(c).encode("utf-8"))
    assert found == {k: list(v) for k, v in memo.PARTNERS_OF.items()}
    assert sorted(sum(found.values(), [])) == sorted(memo.FOLD_PARTNERS)


RECALL_WORDS = ("memory number thing happened at work flask Jinja kelvin KELVIN Kelvin "
                "is IS Is sis SIS kiss KISS ski Istanbul istanbul ship Sıla İzmir "
                "ſhip ſs \u212aelvin \u212aISS \u212a joão João JOÃO ação AÇÃO ÇÃO çao "
                "straße STRASSE ﬁne Ångström \u212bngström 日本語 naïve ΣΊΣΥΦΟΣ σίσυφος "
                "v2.0 3.11 #12 2020-01-01 -01- a,b a b x  y 😀 café CAFÉ").split(" ")

RECALL_PATTERNS = [
    # literals: anchors, lowercased words, fold partners, padding, dense hits
    "k", "K", "s", "i", "is", "kiss", "KISS", "ship", "kelvin", "elvin", "istanbul",
    "izmir", "sıla", "flask", "Jinja", "memory number 5,", "number 12", " 12,", "12,",
    "#1", "#12 ", "#0 ", "#1 2020", "2020-01-0", "-01-", "0", "work", "work ",
    " work", "work  ", "happened at work", "a,b", "a b", " ", "   ", "x  y", "v2.0",
    "3.11", ".11", "café", "joão", "ção", "ÇÃO", "straße", "ss", "ﬁ", "ångström",
    "σίσυφος", "日本", "😀", "qqq", ",", "joão 2020", "Kelvin at", "ſhip 3.11",
    "#1 2020-01-0", "2020-01-01 memory number 1",
    # regexes
    "^#1", r"^#\d+ 2020-01-0[1-3] ", "o$", r"\bwork$", "k.l", "[ſs]hip", r"\s$",
    r"(?<=#)1", r"\A#1", r"x\Z", ".", "", r"\d{4}-\d\d", r"number 4\d,",
    "(?-i:kelvin)", "(?-i:K)", r"\w+ \w+$", "(k|s|i)", "ı", "İ", "\u212a", "\u017f",
    "(?x) k e l", r"ss\b", "[K]",
    # regexes line_test tries from the start or the end of a line
    ".*work", ".*?k.l", ".+at", r".{2,}ship$", r"\w+$", "[^ ]+$", r"(\w+) \1$",
    r"^\w+$", "(?i)o$", r"(?x) \w $ # end", r"(?<=a)\w+\Z", r"(?m)\d$", ".*$", "$",
    # regexes holding literals plan looks for (needles)
    r"[a-z]+ing\b", r"\w+ork", r"k\w*vin", "(?-i:K)elvin", r"ſhip\b", "İzmir$", r"JOÃO\b",
    r"\bstra(ß|ss)e", r"x\s+y", r"v2\.0", r"3\.11\b", r"#12\b", "(?a)kelvin", "(?a)ship",
    r"\d+-01-\d", r"number \d+, a", "(work)", "a,b|a b", r"\x6belvin",
    # runs of a class first (line_test)
    r"\w+ing", r"\S+ at", "[^ ]+ work$", "[a-z]+ship", r"\w*?vin\b", r"\w+ \w+ \w+",
    r"\w{2,}ß", r"\S+$",
    # alternations (needles: one literal a branch)
    "kelvin|ship", "(kiss|ski)ng?", "work|flask|jinja", "istanbul|ſhip", r"k(?:elvin|iss)\b",
    r"a,b|3\.11", "joão|ção", "sis|2020-01-01", "(x  y|v2)",
]


@pytest.fixture(scope="module")
def tricky_stores(tmp_path_factory):
    """Stores of tricky memories, with each one's lines as the plain rule sees them."""
    out = []
    for n, seed in ((1, 1), (64, 3), (65, 4), (960, 6)):  # 960: 3 workers of 300
        rng = random.Random(seed)
        d = str(tmp_path_factory.mktemp("tricky"))
        lines = []
        with open(os.path.join(d, "LOG.txt"), "wb") as f:
            for i in range(n):
                if rng.random() < 0.3:
                    t = "memory number %d, a thing that happened at work" % i
                else:
                    t = " ".join(rng.choice(RECALL_WORDS) for _ in range(rng.randint(1, 12)))
                    t = t.encode()[:200].decode("utf-8", "ignore").strip() or "x"
                # parseable, though memo would not write it (a raw newline: `.*work`
                # tried at the line's start alone missed the match after it)
                if rng.random() < 0.03:
                    t = rng.choice(["tab at end\t", "ff\x0c", "vt\x0b in", "nbsp\xa0",
                                    "cr\r kelvin", "\tlead", "raw\nnewline at work"])
                if i % 64 in (0, 63) and rng.random() < 0.5:  # chunk edges
                    t = rng.choice(["kelvin at the edge", "\u212aelvin ſhip İzmir"])
                day = "2020-01-%02d" % (1 + i % 28)
                f.write(memo.memory_record(i, day, t))
                lines.append("#%d %s %s" % (i, day, t))
        out.append((d, lines))
    return out


RECALL_SETTINGS = [
    dict(),
    dict(CHUNK_RECORDS=64, DENSE=2, WORKER_RECORDS=300, MAX_WORKERS=3, cpus=8),
    dict(CHUNK_RECORDS=64, DENSE=0),
    dict(CHUNK_RECORDS=64, MIN_ANCHOR=1, DENSE=5),
    dict(CHUNK_RECORDS=64, MIN_ANCHOR=100),
    dict(pieces=True, CHUNK_RECORDS=37, PIECE_RECORDS=5, DENSE=3),
    dict(regex_items=lambda pattern: None),  # re's private parser gone
]
RECALL_SETTING_IDS = [",".join("%s=%s" % (k, "None" if callable(v) else v) for k, v in s.items())
                      or "defaults" for s in RECALL_SETTINGS]


@pytest.mark.parametrize("setting", RECALL_SETTINGS, ids=RECALL_SETTING_IDS)
def test_recall_fast_paths_give_the_plain_answer(tricky_stores, monkeypatch, setting):
    """Every recall path (anchor, lowercased, fold partners, dense chunks,
    whole-chunk regex, a regex's needles, line_test's shapes, memmem or
    bytes.find, forked workers, no regex parser), at chunk edges,
    finds exactly what re.search(pattern, line, re.IGNORECASE) finds line
    by line, including non-ASCII case folding (João, ÇÃO, the Kelvin sign)."""
    setting = dict(setting)
    if setting.pop("pieces", False):
        monkeypatch.setattr(memo, "locator", lambda: memo.locate_in_pieces)
    cpus = setting.pop("cpus", None)
    if cpus:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    for name, value in setting.items():
        monkeypatch.setattr(memo, name, value)
    for d, lines in tricky_stores:
        st = memo.Store(d)
        for pattern in RECALL_PATTERNS:
            rx = re.compile(pattern, re.IGNORECASE)
            hits = [(i, line) for i, line in enumerate(lines) if rx.search(line)]
            count, newest = memo.search(st, len(lines), pattern, 7)
            assert (count, [tuple(x) for x in newest]) == (len(hits), hits[-7:]), pattern
        st.close()


NEEDLE_CASES = [  # pattern, literals one of which every match holds
    ("kelvin", ["kelvin"]), ("a,b", ["a,b"]), ("[a-z]+ing\\b", ["ing"]), ("k.l", ["k"]),
    ("\\w+ at w.rk", [" at w"]), ("v2\\.0", ["v2.0"]), ("(?x) k e l", ["kel"]),
    ("(?-i:K)elvin", ["elvin"]), ("(abc)", ["abc"]), ("a*bc?", ["b"]), (".", []),
    ("", []), ("\\x6belvin", ["kelvin"]), ("a\\tb", ["a\tb"]), ("^#12 ", ["#12 "]),
    ("deploy|release|merge", ["deploy", "release", "merge"]), ("ab|cd", ["ab", "cd"]),
    ("foo|", []), ("a|b", []), ("x(deploy|release)d", ["deploy", "release"]),
    ("fix(es)?|bug", ["fix", "bug"]), ("(?:ab|c)de", ["de"]), ("k(?:elvin|iss)\\b", ["elvin", "iss"]),
    ("(a|bc(de|fg))x", ["x"]), ("(?:abc|(de|fg)h)x", ["abc", "de", "fg"]),
]


@pytest.mark.parametrize("pattern, literals", NEEDLE_CASES)
def test_needles_are_literals_every_match_holds_one_of(pattern, literals):
    assert memo.needles(pattern, memo.regex_items(pattern)) == literals
    # without re's private parser: a plain literal, else nothing
    assert memo.needles(pattern, None) == ([pattern] if [pattern] == literals else [])


LINE_TEST_CASES = [  # pattern, the shape line_test takes it for
    (".*x.*y", "start"), (".*?error", "start"), (".+at", "start"), (".{2,}k", "start"),
    (".*", "start"), ("(?:.*)ship", "start"), (".*x$", "start"), ("(?s).*k", "start"),
    (r"\w+ing", "run"), (r"\S+\.py", "run"), ("[^ ]+ x", "run"), ("[a-z]+ing", "run"),
    (r"\w*?x", "run"), (r"\w{2,}x", "run"), (r"[\w]+ \w+ \w+", "run"),
    (r"\w+ \w+$", "run+end"), (r"\S+\Z", "run+end"),
    (r"(a|b)\w*$", "end"), (r"(\w+) \1$", "end"), (r"(?<=k)\w+$", "end"), ("$", "end"),
    (r"^\w+$", "plain"), (r"\A#1\d*\Z", "plain"), ("x|y$", "plain"), (".{0,5}x", "plain"),
    ("(.*)x\\1", "plain"), (".*x|y", "plain"), ("(a$)", "plain"), ("(?m)x$", "plain"),
    ("(?x) x $ # a comment", "plain"), ("", "plain"), ("k.l", "plain"), (r"\$", "plain"),
    (r"\d+x", "plain"), (r"\w{0,3}x", "plain"), (r"(\w+) \1", "plain"), (r"(?i)\w+x", "plain"),
    (r"[A-Z]+x", "plain"),
]


def shape(test, rx):
    """Which of line_test's shapes `test` is, for `rx`."""
    if test == rx.match:
        return "start"
    if test == rx.search:
        return "plain"
    text, found = test.__self__.pattern, []
    if text.startswith("(?<!"):
        found.append("run")
    if text.startswith("(?s:.*)(?:"):
        found += ["run", "end"] if text.startswith("(?s:.*)(?:(?<!") else ["end"]
    return "+".join(found)


@pytest.mark.parametrize("pattern, expected", LINE_TEST_CASES)
def test_line_test_matches_search(pattern, expected):
    """line_test tries `.*x` at the start only, `\\w+x` from the starts of
    runs of `\\w`, `x$` from the end, and either way says what
    regex.search says, on lines of every shape.
    (Bug it pins: at a million memories `memo recall '.*error'` was
    stopped after 5 s, and `\\w+ \\w+$` took 3.6 s.)"""
    rx = re.compile(pattern, re.IGNORECASE)
    test = memo.line_test(pattern, rx, memo.regex_items(pattern))
    assert shape(test, rx) == expected
    rng = random.Random(pattern)
    words = RECALL_WORDS + ["x", "y", "error", "k", "ab", "a b", "ba", "", "$", "\\", "ing",
                            "kiss.py", "a.py"]
    lines = ["#%d 2020-01-01 %s" % (i, " ".join(rng.choice(words) for _ in range(i % 9)))
             for i in range(400)] + ["", "x", "k", " ", "xy", "a a", "ks", "ing", "king x"]
    for line in lines:
        assert bool(test(line)) == bool(rx.search(line)), (pattern, line)


@pytest.mark.parametrize("first", [0, 5, 9990, 99 * 1000 - 30, 10 ** 6 - 4096])
def test_chunk_check_never_passes_a_damaged_record(first):
    """chunk_ok's strided bulk check passes a clean chunk, and never one
    holding a record that does not parse as its own memory, across id-width
    changes (9 to 10, 99999 to 100000).  (When it fails, recall parses each
    record on its own, so a false alarm costs time, never a wrong answer.)"""
    n = 300 if first < 10 ** 6 - 4096 else 4096
    good = b"".join(memo.memory_record(first + i, "2020-02-03", "text %d é" % i)
                    for i in range(n))
    assert memo.chunk_ok(first, n, good)
    rng = random.Random(first)
    for _ in range(100):
        i = rng.randrange(n)
        at = i * 320 + rng.choice([0, 1, 2, 3, 5, 8, 10, 12, 15, 17, 20, 100, 319])
        bad = bytearray(good)
        bad[at] = rng.choice(b"#0123456789 -\xff\x00x")
        try:
            memo.parse_memory(first + i, bytes(bad[i * 320:(i + 1) * 320]))
        except memo.Damaged:
            assert not memo.chunk_ok(first, n, bytes(bad)), bytes(bad[i * 320:][:30])
