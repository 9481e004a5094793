"""Block math for memo: aligned power-of-two covers and the completion order.

Pure functions of integers, no I/O.  A *block* is a half-open range of
memory ids ``(lo, hi)`` whose size ``hi - lo`` is a power of two and whose
``lo`` is a multiple of that size; size 1 is a single raw memory.  Blocks of
size >= 2 form a binary merge tree over the log: the halves of ``(lo, hi)``
are ``(lo, mid)`` and ``(mid, hi)``.  A block is *complete* at ``T`` (the
number of memories) when ``hi <= T``; only complete blocks are ever
summarized.

``T`` is at most a few billion in practice; every function here costs a
number of steps that grows with its output or with ``log2(T)``, never with
``T`` itself, except ``complete`` which lists about ``T`` blocks (use
``complete_count`` to count them).
"""

__all__ = ["is_block", "halves", "roots", "refinements", "bands", "cover",
           "complete", "complete_count", "completed_at"]


def is_block(lo, hi):
    """True iff ``(lo, hi)`` is an aligned power-of-two block of size >= 1."""
    size = hi - lo
    return lo >= 0 and size >= 1 and size & (size - 1) == 0 and lo % size == 0


def halves(lo, hi):
    """The two halves ``(lo, mid), (mid, hi)`` of a block of size >= 2."""
    mid = (lo + hi) // 2
    return (lo, mid), (mid, hi)


def roots(T):
    """The coarsest cover of ``[0, T)``: one block per set bit of ``T``.

    Oldest (largest) first.  No tiling of ``[0, T)`` by aligned blocks has
    fewer pieces than this one, which has ``bin(T).count("1")``.
    """
    out, lo = [], 0
    for bit in reversed(range(T.bit_length())):
        size = 1 << bit
        if T & size:
            out.append((lo, lo + size))
            lo += size
    return out


def bands(T):
    """Yield the bands ``j = 1, 2, ...`` of ``refinements(T)`` (see there):
    for each, the sizes of the blocks it splits, in the order it splits
    them (the ``j``-th newest complete block of each).  ``O(log2(T))`` a
    band."""
    sizes = [1 << k for k in range(1, T.bit_length())]  # each has a complete block
    if not sizes:
        return
    top = 1 << T.bit_length()  # above every size: (T % s) * (top // s) orders f exactly
    yield sorted(sizes, key=lambda s: ((T % s) * (top // s), -s))
    order, band = sorted(sizes, key=lambda s: ((T % s) * (top // s), s)), 2
    while True:
        order = [s for s in order if T // s >= band]  # the sizes with a band-th block
        if not order:
            return
        yield order
        band += 1


def refinements(T):
    """Yield, one at a time, the blocks that ``cover`` splits as budget grows.

    Starting from ``roots(T)``, each step splits the block with the largest
    ratio of size to age (``T - lo``), the newest first on a tie, until every
    block is a single memory: ``T - bin(T).count("1")`` steps in all.  A
    child's ratio never exceeds its parent's (a complete block has
    ``size <= age``), so this is the order in which the rule "keep a block
    whole iff ``size <= alpha * age``" splits blocks as ``alpha`` falls.

    The invariant that makes the result a valid ``cover``: sizes never
    increase toward the present.  When a block of size ``s`` is split, its
    newer neighbour has a larger ratio at any size >= ``s``, so it has
    already been split down to at most ``s / 2``.

    No heap is needed: the ``j``-th newest complete block of size ``s`` has
    ``age / size == j + f`` with ``f = (T % s) / s`` in [0, 1).  So blocks
    come in bands ``j = 1, 2, ...``, each holding the ``j``-th newest block
    of every size that has one, in order of ``f`` (compared exactly).  Two
    sizes tie only at ``f == 0``, where both divide ``T``: the newest block
    (the smaller) goes first, except in band 1, where such blocks all end
    at ``T`` and each is the parent of the next (the larger first).  Each
    block costs O(1) steps, and a band O(log2(T)).
    """
    for band, sizes in enumerate(bands(T), 1):
        for s in sizes:
            lo = (T // s - band) * s  # the band-th newest complete block of size s
            yield lo, lo + s


def cover(T, budget):
    """The blocks ``wake`` prints for a memory of ``T`` entries.

    Returns a list of ``(lo, hi)`` tuples that tile ``[0, T)`` exactly, oldest
    first, each an aligned power-of-two block, with sizes that never increase
    toward the present.  If ``T <= budget`` every memory is its own block.
    Otherwise there are exactly ``max(budget, bin(T).count("1"))`` blocks:
    the whole budget is spent, with the extra detail going to the most recent
    memories (no tiling has fewer than ``roots(T)``, so a budget below that is
    raised to it).  Every block of size >= 2 is complete, so it is in
    ``complete(T)``.  The cover splits exactly the first
    ``budget - bin(T).count("1")`` blocks of ``refinements(T)``.

    Built from counts, not from the blocks split: refinements splits the
    newest blocks of each size first, so if ``split[s]`` of them are split,
    the blocks of size ``s`` and less tile ``[(T // 2s - split[2s]) * 2s, T)``.
    Costs ``O(budget + log2(T) ** 2)`` whatever ``T`` is.
    """
    if T <= max(budget, 0):
        return [(i, i + 1) for i in range(T)]
    steps, split = budget - bin(T).count("1"), {}
    for sizes in bands(T):
        if steps <= 0:
            break
        for s in sizes[:steps]:
            split[s] = split.get(s, 0) + 1
        steps -= len(sizes)
    out, lo, size = [], 0, 1 << (T.bit_length() - 1)
    while size:
        hi = (T // size - split.get(size, 0)) * size if size > 1 else T
        out += [(a, a + size) for a in range(lo, hi, size)]
        lo, size = hi, size // 2
    return out


def completed_at(hi):
    """The blocks of size >= 2 that memory ``hi - 1`` completes, smallest first.

    One per trailing zero bit of ``hi``: going from ``T - 1`` to ``T``
    memories adds ``len(completed_at(T))`` compressions, so work never spikes.
    """
    out, size = [], 2
    while hi > 0 and hi % size == 0:
        out.append((hi - size, hi))
        size *= 2
    return out


def complete(T):
    """Every block of size >= 2 complete at ``T``, in the order they complete.

    Ordered by ``hi``, then by size: each block comes after its two halves.
    This is the order summaries are built in.  About ``T`` blocks: see
    ``complete_count`` to count them without listing.
    """
    return [block for hi in range(2, T + 1, 2) for block in completed_at(hi)]


def complete_count(T):
    """``len(complete(T))`` in O(1): ``sum(T >> k for k >= 1) == T - popcount(T)``."""
    return T - bin(T).count("1") if T > 0 else 0
