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
    lines, k, n = [], 1, None
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


def test_forget_and_rebuild(store, tmp_path):
    imported(store, tmp_path, 40)
    pay_all(store)
    sizes = {n: os.path.getsize(os.path.join(store, "TREE", n))
             for n in os.listdir(os.path.join(store, "TREE"))}
    r = call(store, "forget", "16-23")
    # 16-23, 24-31 and 32-39 at level 8, 16-31 at 16, 0-31 at 32
    assert r.code == 0 and "Forgot 5 summaries: 16-23" in r.out and "Run: memo sleep" in r.out
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


def test_import_ok_with_bom_crlf_and_blank_lines(store, tmp_path):
    path = tmp_path / "h.txt"
    path.write_bytes(b"\xef\xbb\xbf2020-01-01 first\r\n\r\n  \n2020-01-03 second\n2020-01-03 third")
    r = call(store, "import", str(path))
    assert r.code == 0, r
    assert r.out == ("Imported 3 memories, #0 to #2.\n1 compression pending.\n"
                     "Run: memo sleep\n")
    assert call(store, "recall", "^#2 ").out.startswith("#2 2020-01-03 third\n")


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


def test_note_and_sleep_read_stdin(store):
    text = "costs $HOME `whoami` and \"quotes\" 'too'"
    r = cli(store, "note", "-", stdin=(text + "\n").encode())
    assert r.code == 0, r
    cli(store, "note", "second")
    r = cli(store, "sleep", "0-1", "-", stdin=b"summary with $PATH\n")
    assert r.code == 0 and "0-1 saved." in r.out
    assert call(store, "zoom", "0-1").out.startswith("#0 %s %s\n" % (memo.today(), text))
    r = cli(store, "note", "-", stdin=b"two\nlines\n")
    assert r.code == 1 and "one line" in r.err


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
    imported(store, tmp_path, 100)
    shell = "grep '^  #' | cut -c3- | tr '\\n' ' ' | cut -c1-200"
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


def test_recall_highlights_only_on_a_terminal(store):
    import pty
    call(store, "note", "the Flask decision")
    env = dict(os.environ, MEMORY_DIR=store)
    env.pop("NO_COLOR", None)
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(MEMO, [MEMO, "recall", "flask"], env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    assert b"\x1b[1;31mFlask\x1b[0m" in out
    piped = cli(store, "recall", "flask")
    assert "\x1b" not in piped.out and "the Flask decision" in piped.out


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    command = re.search(r"^    (v=\$\(mktemp -d\) .*pytest -q test\.py)$", readme, re.M).group(1)
    assert command in open(os.path.join(HERE, ".ci", "run")).read().splitlines()


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


@pytest.mark.parametrize("text", ["<your line>", "<one line>", " <your line> "])
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
