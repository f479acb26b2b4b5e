"""checkers/race_history.py on its own: a buffer's live access records and their index.

The index only narrows which records a new access visits; what it must never do is leave
out a record the access overlaps (it could race with it or prune it), or change their
order (findings come out in it). Checked against the plain answer, every record that
overlaps, on the access patterns the index is chosen for: a SparseCore kernel's
(L,)-vector reads of a two-slot chunk buffer (rows x column chunks: two dimensions), and a
mix where a second dimension would make most records wide (one dimension kept)."""

from __future__ import annotations

import itertools

from pallas_check.checkers.race_history import AccessRecord, History


def record(rng, actor: str = "core 0", is_write: bool = False) -> AccessRecord:
    return AccessRecord(actor, 1, rng, is_write, "write" if is_write else "read", "rows_v",
                        "VMEM", (), None, actor)


def fill(history: History, records) -> None:
    """Add records as the race checker does: each access looks its range up, then is
    added (an index chosen on the first few records is chosen again, when the history
    has doubled, if the lookups since visited too many)."""
    for r in records:
        history.candidates(r.index_range)
        history.add(r)


def overlaps(a, b) -> bool:
    return all(lo < bhi and blo < hi for (lo, hi), (blo, bhi) in zip(a, b))


def chunk_reads(slots=2, rows=32, chunks=16, lanes=8):
    """The (L,)-vector reads of a (slots, rows, chunks * lanes) buffer, one record each."""
    return [((s, s + 1), (r, r + 1), (c * lanes, (c + 1) * lanes))
            for s, r, c in itertools.product(range(slots), range(rows), range(chunks))]


def test_vector_reads_are_indexed_by_row_and_column_and_visit_only_their_own_box():
    history = History()
    fill(history, [record(rng) for rng in chunk_reads()])
    assert history.dims is not None and history.dims[1] >= 0  # two dimensions
    found = history.candidates(((1, 2), (5, 6), (24, 32)))
    # the same row and column chunk in both slots, nothing else
    assert [r.index_range for _, r in found] == [((0, 1), (5, 6), (24, 32)),
                                                ((1, 2), (5, 6), (24, 32))]


def test_every_overlapping_record_is_visited_in_the_order_it_was_made():
    history = History()
    records = [record(rng) for rng in chunk_reads()]
    records.insert(300, record(((0, 1), (0, 32), (0, 128)), "DMA #1", True))  # a wide write
    fill(history, records)
    for query in [((0, 1), (7, 8), (40, 48)), ((0, 2), (3, 9), (0, 128)),
                  ((1, 2), (31, 32), (120, 128)), ((0, 1), (0, 32), (8, 16))]:
        visited = [r for _, r in history.candidates(query)]
        seqs = [s for s, _ in history.candidates(query)]
        assert seqs == sorted(seqs)
        wanted = [r for r in records if overlaps(r.index_range, query)]
        assert [r for r in visited if overlaps(r.index_range, query)] == wanted


def test_removed_records_are_gone_from_their_buckets():
    history = History()
    fill(history, [record(rng) for rng in chunk_reads(slots=1)])
    first = [s for s, r in history.candidates(((0, 1), (0, 1), (0, 8)))]
    assert len(first) == 1
    history.remove(first[0])
    assert history.candidates(((0, 1), (0, 1), (0, 8))) == []
    assert len(history) == 32 * 16 - 1


def test_a_second_dimension_that_would_make_records_wide_is_not_taken():
    """Whole-row reads (128 lanes) beside (L,)-vector reads: by row and column chunk, the
    whole-row reads would span 16 buckets each (kept aside, visited by every access); by
    row alone they sit in their row's bucket."""
    history = History()
    fill(history, [record(rng) for r in range(40)
                   for rng in (((r, r + 1), (0, 128)), ((r, r + 1), (0, 8)))])
    assert history.dims is not None and history.dims[1] < 0  # one dimension
    found = [rec.index_range for _, rec in history.candidates(((7, 8), (0, 8)))]
    assert found == [((7, 8), (0, 128)), ((7, 8), (0, 8))]


def table_reads(rows: int = 4, cols: int = 8, rounds: int = 3):
    """Scalar loads of a (rows, cols) SMEM table, every element read `rounds` times in an
    interleaved order (a page table's entries)."""
    return [((r, r + 1), (c, c + 1)) for _ in range(rounds)
            for c in range(cols) for r in range(rows)]


def test_one_element_records_are_kept_by_element():
    """While every record is one element, an access to one element visits the records of
    that element alone, in the order they were made."""
    history = History()
    records = [record(rng, "core 0", i % 5 == 0) for i, rng in enumerate(table_reads())]
    for r in records:
        history.add(r, element=True)
    assert history.cells is not None and history.dims is None
    query = ((2, 3), (5, 6))
    found = history.candidates(query, element=True)
    assert [r for _, r in found] == [r for r in records if r.index_range == query]
    assert [s for s, _ in found] == sorted(s for s, _ in found)
    history.remove(found[0][0])
    assert [r for _, r in history.candidates(query, element=True)] == [
        r for _, r in found[1:]]


def test_an_access_of_more_than_one_element_indexes_the_records():
    """A row read among scalar loads: the history leaves records by element for good, and
    the row visits every record it overlaps, in order."""
    history = History()
    records = [record(rng) for rng in table_reads()]
    for r in records:
        history.add(r, element=True)
    row = ((1, 2), (0, 8))
    visited = [r for _, r in history.candidates(row)]
    assert history.cells is None
    assert [r for r in visited if overlaps(r.index_range, row)] == [
        r for r in records if overlaps(r.index_range, row)]
    history.add(record(row))
    assert [r.index_range for _, r in history.candidates(((1, 2), (3, 4)))][-1] == row


def shared(a, b):
    """The elements two boxes share (None: none)."""
    box = tuple((max(lo, blo), min(hi, bhi)) for (lo, hi), (blo, bhi) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def plain_walk(records, new, seen):
    """The walk as the race checker defines it, over every record: races of the records
    `new` is not ordered after (overlapping, one a write, not two atomic adds), and the
    records kept (those it is ordered after and covers, it a write or they reads, go)."""
    races, kept = [], []
    for seq, prev in records:
        if prev.actor == new.actor or prev.epoch <= seen.get(prev.slot, 0):
            if ((new.is_write or not prev.is_write) and (not new.atomic_add or prev.atomic_add)
                    and shared(new.index_range, prev.index_range) == prev.index_range):
                continue
        elif (prev.is_write or new.is_write) and not (new.atomic_add and prev.atomic_add):
            overlap = shared(prev.index_range, new.index_range)
            if overlap is not None:
                races.append((seq, prev, overlap))
        kept.append((seq, prev))
    return races, kept


def double_buffer_ranges():
    """A (2, 2, 16, 128) K/V scratch: a DMA lands one page of a slot, a core reads a slot."""
    pages = [((s, s + 1), (p, p + 1), (0, 16), (0, 128)) for s in range(2) for p in range(2)]
    return pages + [((s, s + 1), (0, 2), (0, 16), (0, 128)) for s in range(2)]


def test_few_ranges_are_kept_by_range_and_the_walk_is_the_plain_one():
    """A double-buffered scratch's accesses (issue 55.4): its records are kept by range,
    each access visits only the ranges it overlaps, and what the walk (`check`) finds and
    keeps is what a walk of every record would, races in the order the records were made."""
    import random
    rng = random.Random(7)
    history, plain, seq = History(), [], 0
    ranges = double_buffer_ranges()
    for step in range(400):
        actor = rng.choice(["core 0", "DMA #1", "DMA #2", "DMA #3"])
        new = AccessRecord(actor, rng.randint(1, 3), rng.choice(ranges), rng.random() < 0.5,
                           "access", "k_vmem_buffer", "VMEM", (), None, actor,
                           rng.random() < 0.1)
        seen = {slot: rng.randint(0, 3) for slot in ["core 0", "DMA #1", "DMA #2", "DMA #3"]}
        races, kept = plain_walk(plain, new, seen)
        found = history.check(new, False, seen.get)
        assert (found or []) == races, step
        seq += 1
        plain = kept + [(seq, new)]
        assert list(history.records.items()) == plain, step
    assert history.groups is not None and len(history.groups) == len(ranges)
    # a page's DMA landing visits its page's records and its slot's reads, no others
    page = ranges[1]
    assert {r.index_range for _, r in history.candidates(page)} <= {page, ranges[4]}


def test_many_ranges_leave_records_by_range_for_the_index_and_the_walk_is_the_same():
    """Past 16 distinct ranges (one block per grid step) the history is indexed instead,
    and the walk still finds and keeps what the plain one does."""
    history, plain, seq = History(), [], 0
    for step in range(40):
        new = record(((step % 24, step % 24 + 1), (0, 128)), f"DMA #{step % 3}", True)
        races, kept = plain_walk(plain, new, {})
        assert (history.check(new, False, {}.get) or []) == races
        seq += 1
        plain = kept + [(seq, new)]
        assert list(history.records.items()) == plain
    assert history.groups is None and history.dims is not None
