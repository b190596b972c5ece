"""Notebook 02's Triton puzzles: each check passes the notebook's solution, reports the student
copy's stub as not written yet, and names the mistake of each plausible wrong answer.

The wrong answers are the mistakes a reader makes, each written as the solution with that one
change (:func:`one_change`: the pieces of source it replaces, beside what the reader wrote); each
check must say what was wrong (which row, never written or written wrong, why).
"""

from __future__ import annotations

import inspect
import linecache
from pathlib import Path

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.text import Text

import c2graph  # noqa: F401  (first: without CUDA it sets TRITON_INTERPRET=1 before Triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from c2graph.workshop import kernel as wk
from c2graph.workshop import puzzles
from c2graph.pictures.style import MAX_WIDTH, MIN_FONT
from c2graph.workshop.student import find_exercises, stub_source

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_the_fused_kernel.ipynb"


def one_change(solution, name: str, changes: list[tuple[str, str]]):
    """A wrong answer: ``solution``'s source with each ``(old, new)`` piece of its body changed (each
    piece found exactly once), compiled as the ``@triton.jit`` function ``name``, its source kept
    where Triton and the checks read it (as a notebook cell's is)."""
    source = inspect.getsource(getattr(solution, "fn", solution))
    for old, new in changes:
        assert source.count(old) == 1, (name, old)
        source = source.replace(old, new)
    source = source.replace(f"def {solution.fn.__name__}(", f"def {name}(", 1)
    filename = f"<wrong answer {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"triton": triton, "tl": tl}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


# --- puzzle 1: the rows a request owns ----------------------------------------------------------------


@triton.jit
def row_slots(offsets_ptr, slot_ptr, num_rows, request_slots, ROWS: tl.constexpr, S_PAD: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    s = tl.arange(0, S_PAD)
    real = s < request_slots
    starts = tl.load(offsets_ptr + s, mask=real, other=0)
    ends = starts + tl.load(offsets_ptr + request_slots + s, mask=real, other=0)
    inside = (starts[None, :] <= rows[:, None]) & (rows[:, None] < ends[None, :])
    tl.store(slot_ptr + rows, tl.max(tl.where(inside, s[None, :], -1), axis=1), mask=rows < num_rows)


row_slots_unmasked_offsets = one_change(row_slots, "row_slots_unmasked_offsets", [
    ('    real = s < request_slots\n    starts = tl.load(offsets_ptr + s, mask=real, other=0)\n    ends = starts + tl.load(offsets_ptr + request_slots + s, mask=real, other=0)',
     '    starts = tl.load(offsets_ptr + s)\n    ends = starts + tl.load(offsets_ptr + request_slots + s)'),
])


row_slots_end_included = one_change(row_slots, "row_slots_end_included", [
    ('    inside = (starts[None, :] <= rows[:, None]) & (rows[:, None] < ends[None, :])',
     '    inside = (starts[None, :] <= rows[:, None]) & (rows[:, None] <= ends[None, :])'),
])


row_slots_store_unmasked = one_change(row_slots, "row_slots_store_unmasked", [
    ('    tl.store(slot_ptr + rows, tl.max(tl.where(inside, s[None, :], -1), axis=1), mask=rows < num_rows)',
     '    tl.store(slot_ptr + rows, tl.max(tl.where(inside, s[None, :], -1), axis=1))'),
])


row_slots_first_block_only = one_change(row_slots, "row_slots_first_block_only", [
    ('    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)',
     '    rows = tl.arange(0, ROWS)  # program_id forgotten: every program writes rows 0 to ROWS - 1'),
])


# --- puzzle 2: a masked gather of partner rows ----------------------------------------------------------


@triton.jit
def gather_partners(x_ptr, ring_ptr, pos_ptr, req_ptr, first_ptr, group_ptr, out_ptr, num_rows,
                    D: tl.constexpr, RING: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    inside = rows < num_rows
    group = tl.load(group_ptr + rows, mask=inside, other=0) != 0
    first = tl.load(first_ptr + rows, mask=inside, other=0) != 0
    pos = tl.load(pos_ptr + rows, mask=group, other=1)
    req = tl.load(req_ptr + rows, mask=group, other=0)
    src = tl.where(first, ring_ptr + (req * RING + (pos - 1) % RING) * D, x_ptr + (rows - 1) * D)
    cols = tl.arange(0, D)
    m = group[:, None]
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], tl.load(src[:, None] + cols[None, :], mask=m), mask=m)


partners_ring_at_pos = one_change(gather_partners, "partners_ring_at_pos", [
    ('    src = tl.where(first, ring_ptr + (req * RING + (pos - 1) % RING) * D, x_ptr + (rows - 1) * D)',
     '    src = tl.where(first, ring_ptr + (req * RING + pos % RING) * D, x_ptr + (rows - 1) * D)'),
])


partners_always_previous = one_change(gather_partners, "partners_always_previous", [
    ('    group = tl.load(group_ptr + rows, mask=inside, other=0) != 0\n    first = tl.load(first_ptr + rows, mask=inside, other=0) != 0\n    pos = tl.load(pos_ptr + rows, mask=group, other=1)\n    req = tl.load(req_ptr + rows, mask=group, other=0)\n    src = tl.where(first, ring_ptr + (req * RING + (pos - 1) % RING) * D, x_ptr + (rows - 1) * D)',
     '    group = tl.load(group_ptr + rows, mask=inside, other=0) != 0'),
    ('    tl.store(out_ptr + rows[:, None] * D + cols[None, :], tl.load(src[:, None] + cols[None, :], mask=m), mask=m)',
     '    prev = tl.load(x_ptr + (rows - 1)[:, None] * D + cols[None, :], mask=m)\n    tl.store(out_ptr + rows[:, None] * D + cols[None, :], prev, mask=m)'),
])


partners_every_row = one_change(gather_partners, "partners_every_row", [
    ('    inside = rows < num_rows\n    group = tl.load(group_ptr + rows, mask=inside, other=0) != 0',
     '    inside = rows < num_rows'),
    ('    pos = tl.load(pos_ptr + rows, mask=group, other=1)\n    req = tl.load(req_ptr + rows, mask=group, other=0)',
     '    pos = tl.load(pos_ptr + rows, mask=inside, other=1)\n    req = tl.load(req_ptr + rows, mask=inside, other=0)'),
    ('    m = group[:, None]',
     '    m = inside[:, None]'),
])


partners_unmasked_rows = one_change(gather_partners, "partners_unmasked_rows", [
    ('    inside = rows < num_rows\n    group = tl.load(group_ptr + rows, mask=inside, other=0) != 0\n    first = tl.load(first_ptr + rows, mask=inside, other=0) != 0',
     '    group = tl.load(group_ptr + rows) != 0\n    first = tl.load(first_ptr + rows) != 0'),
])


partners_unmasked_pos = one_change(gather_partners, "partners_unmasked_pos", [
    ('    pos = tl.load(pos_ptr + rows, mask=group, other=1)\n    req = tl.load(req_ptr + rows, mask=group, other=0)',
     '    pos = tl.load(pos_ptr + rows)\n    req = tl.load(req_ptr + rows)'),
])


# --- puzzle 3: a row sum in a fixed order -----------------------------------------------------------------


@triton.jit
def row_sum(x, LOG2_N: tl.constexpr):
    for _ in tl.static_range(LOG2_N):
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = even + odd
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def row_sum_tl_sum(x, LOG2_N: tl.constexpr):
    return tl.sum(x, axis=1)


@triton.jit
def row_sum_halves(x, LOG2_N: tl.constexpr):
    for _ in tl.static_range(LOG2_N):
        first, second = tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2)), (0, 2, 1)))
        x = first + second
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def row_sum_one_by_one(x, LOG2_N: tl.constexpr):
    cols = tl.arange(0, 1 << LOG2_N)
    total = tl.sum(tl.where(cols[None, :] == 0, x, 0.0), axis=1)
    for c in tl.static_range(1, 1 << LOG2_N):
        total = total + tl.sum(tl.where(cols[None, :] == c, x, 0.0), axis=1)
    return total


@triton.jit
def row_sum_not_reshaped(x, LOG2_N: tl.constexpr):
    for _ in tl.static_range(LOG2_N):
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = even + odd
    return x


@triton.jit
def row_sum_in_half_precision(x, LOG2_N: tl.constexpr):
    x = x.to(tl.float16)  # "faster": but the sums come back in fp16
    for _ in tl.static_range(LOG2_N):
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = even + odd
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def row_sum_wrong_axis(x, LOG2_N: tl.constexpr):
    return tl.sum(tl.reshape(tl.trans(x), (x.shape[0], x.shape[1])), axis=1)


# --- puzzle 4: the park loop with run-time bounds -----------------------------------------------------


@triton.jit
def park(x_ptr, ring_ptr, pos_ptr, req_ptr, offsets_ptr, first_pair_ptr, request_slots,
         D: tl.constexpr, RING: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, S_PAD: tl.constexpr):
    b = tl.program_id(0)
    s = tl.arange(0, S_PAD)
    first_pair = tl.load(first_pair_ptr + s, mask=s < request_slots, other=2**30)
    lo = tl.sum((first_pair < b * GROUPS_PER_BLOCK).to(tl.int32), axis=0)
    hi = tl.sum((first_pair < (b + 1) * GROUPS_PER_BLOCK).to(tl.int32), axis=0)
    j, cols = tl.arange(0, RING), tl.arange(0, D)
    for r in range(lo, hi):
        start = tl.load(offsets_ptr + r)
        count = tl.load(offsets_ptr + request_slots + r)
        n_park = tl.minimum(count, RING)
        src = start + count - n_park + j
        ok = j < n_park
        dst = tl.load(req_ptr + src, mask=ok, other=0) * RING + tl.load(pos_ptr + src, mask=ok, other=0) % RING
        rows = tl.load(x_ptr + src[:, None] * D + cols[None, :], mask=ok[:, None])
        tl.store(ring_ptr + dst[:, None] * D + cols[None, :], rows, mask=ok[:, None])


park_every_request = one_change(park, "park_every_request", [
    ('    b = tl.program_id(0)\n    s = tl.arange(0, S_PAD)\n    first_pair = tl.load(first_pair_ptr + s, mask=s < request_slots, other=2**30)\n    lo = tl.sum((first_pair < b * GROUPS_PER_BLOCK).to(tl.int32), axis=0)\n    hi = tl.sum((first_pair < (b + 1) * GROUPS_PER_BLOCK).to(tl.int32), axis=0)',
     ''),
    ('    for r in range(lo, hi):',
     '    for r in range(0, request_slots):  # every program parks every request'),
])


park_without_min = one_change(park, "park_without_min", [
    ('        n_park = tl.minimum(count, RING)\n        src = start + count - n_park + j\n        ok = j < n_park',
     '        src = start + count - RING + j  # a request of one row parks the row before it too\n        ok = j < RING'),
])


park_first_rows = one_change(park, "park_first_rows", [
    ('        n_park = tl.minimum(count, RING)\n        src = start + count - n_park + j\n        ok = j < n_park',
     "        src = start + j  # the request's first rows, not its last\n        ok = j < tl.minimum(count, RING)"),
])


park_unmasked_first_pairs = one_change(park, "park_unmasked_first_pairs", [
    ('    s = tl.arange(0, S_PAD)\n    first_pair = tl.load(first_pair_ptr + s, mask=s < request_slots, other=2**30)',
     '    first_pair = tl.load(first_pair_ptr + tl.arange(0, S_PAD))  # reads S_PAD - request_slots values past the table'),
])


park_at_partner_row = one_change(park, "park_at_partner_row", [
    ('        dst = tl.load(req_ptr + src, mask=ok, other=0) * RING + tl.load(pos_ptr + src, mask=ok, other=0) % RING',
     "        pos = tl.load(pos_ptr + src, mask=ok, other=0)\n        dst = tl.load(req_ptr + src, mask=ok, other=0) * RING + (pos - 1) % RING  # the partner's place"),
])


park_store_unmasked = one_change(park, "park_store_unmasked", [
    ('        tl.store(ring_ptr + dst[:, None] * D + cols[None, :], rows, mask=ok[:, None])',
     '        tl.store(ring_ptr + dst[:, None] * D + cols[None, :], rows)  # no j < n_park on the store'),
])


@triton.jit
def row_sum_wrong_reshape(x, LOG2_N: tl.constexpr):
    for _ in tl.static_range(LOG2_N):  # the reshape asks for twice the elements
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], 2)))
        x = even + odd
    return tl.reshape(x, (x.shape[0],))


@triton.jit
def row_sum_python_range(x, LOG2_N: tl.constexpr):
    for _ in range(LOG2_N):  # passes in the interpreter; compiled, x may not change shape in the loop
        even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        x = even + odd
    return tl.reshape(x, (x.shape[0],))


SOLUTIONS = [(wk.check_row_slots, row_slots), (wk.check_partners, gather_partners), (wk.check_row_sum, row_sum),
             (wk.check_park, park)]

WRONG = [
    (wk.check_row_slots, row_slots_unmasked_offsets, "mask=s < request_slots"),
    (wk.check_row_slots, row_slots_end_included, "one past its last row"),
    (wk.check_row_slots, row_slots_store_unmasked, "past the last row"),
    (wk.check_row_slots, row_slots_first_block_only, "never written"),
    (wk.check_partners, partners_ring_at_pos, "you used pos % RING"),
    (wk.check_partners, partners_always_previous, "its partner (pos"),
    (wk.check_partners, partners_every_row, "completes no group"),
    (wk.check_partners, partners_unmasked_rows, "past the last row"),
    (wk.check_partners, partners_unmasked_pos, "read pos_ptr[4], past its last value (4 values, 0 to 3) at `pos = "
                                               "tl.load(pos_ptr + rows)`"),
    (wk.check_row_sum, row_sum_tl_sum, "another order of adds"),
    (wk.check_row_sum, row_sum_halves, "the two halves"),
    (wk.check_row_sum, row_sum_one_by_one, "one after another"),
    (wk.check_row_sum, row_sum_not_reshaped, "a [rows] tile"),
    (wk.check_row_sum, row_sum_wrong_axis, "not the row's sum"),
    (wk.check_row_sum, row_sum_in_half_precision, "must return fp32"),
    (wk.check_park, park_every_request, "parked by one program only"),
    (wk.check_park, park_without_min, "n_park = min(count, RING)"),
    (wk.check_park, park_first_rows, "is not one of its last"),
    (wk.check_park, park_unmasked_first_pairs, "parked by one program only"),
    (wk.check_park, park_at_partner_row, "(pos - 1) % RING is where a row's partner is read from"),
    (wk.check_park, park_store_unmasked, "mask the store with j < n_park"),
    (wk.check_row_sum, row_sum_wrong_reshape, "at `even, odd = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], 2)))`: "
                                              "tl.reshape must keep the number of elements"),
    (wk.check_row_sum, row_sum_python_range, "Loop with tl.static_range"),
]


@pytest.mark.parametrize("check, solution", SOLUTIONS, ids=[s.fn.__name__ for _, s in SOLUTIONS])
@pytest.mark.parametrize("seed", [0, 5])
def test_check_passes_the_solution(check, solution, seed):
    result = check(solution, seed=seed)
    assert result.ok, str(result)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_every_solution_passes_on_random_batches(seed):
    for check, solution in SOLUTIONS:
        result = check(solution, seed=seed)
        assert result.ok, str(result)


@pytest.mark.parametrize("check, wrong, says", WRONG, ids=[w.fn.__name__ for _, w, _ in WRONG])
def test_check_names_the_mistake_of_a_wrong_answer(check, wrong, says):
    result = check(wrong, seed=1)
    assert not result.ok
    assert says in str(result), str(result)


# --- the notebook's own cells: each solution passes its check, each stub fails it ----------------------


def notebook_exercises() -> list[tuple[str, str]]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return [(nb.cells[e.solution].source, nb.cells[e.check].source) for e in find_exercises(nb, NOTEBOOK.name)]


def run_cells(*sources: str) -> dict:
    """Run solution cells in order, in one namespace, as the notebook does (the assembly calls the
    puzzles' functions), each source kept where @triton.jit reads it back."""
    ns: dict = {"__name__": "__main__"}  # as in a notebook: compiled Triton reads a callee's __module__
    exec("import triton\nimport triton.language as tl\nfrom c2graph.workshop.kernel import *\n"
         "from c2graph.workshop.assembly import *", ns)
    for source in sources:
        name = f"<notebook-02-cell-{len(linecache.cache)}>"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        exec(compile(source, name, "exec"), ns)
    return ns


def test_the_notebook_has_the_four_puzzles_then_the_assembly_in_order():
    checks = [check for _, check in notebook_exercises()]
    assert checks == ["check_row_slots(row_slots)", "check_partners(gather_partners)", "check_row_sum(row_sum)",
                      "check_park(park)", "check_gate_norm(gate_rms_norm)", "check_compressor(my_compressor)"]


@pytest.mark.parametrize("index", range(6))
def test_the_notebooks_solution_passes_and_its_student_stub_says_what_to_do(index):
    exercises = notebook_exercises()
    before = [solution for solution, _ in exercises[:index]]
    solution, check = exercises[index]
    result = eval(check, run_cells(*before, solution))
    assert result.ok, str(result)
    stub = eval(check, run_cells(*before, stub_source(solution)))
    assert not stub.ok and "not written yet" in str(stub) and "still raises NotImplementedError" in str(stub), str(stub)


def test_a_function_that_is_no_triton_function_or_has_another_signature_is_named():
    said = str(wk.check_row_slots(lambda *args: None))
    assert "is not a Triton function: decorate it with @triton.jit" in said
    said = str(wk.check_partners(row_slots))
    assert "row_slots takes (offsets_ptr, slot_ptr" in said and "keep the signature" in said


# --- the pictures of one program ----------------------------------------------------------------------


@pytest.mark.parametrize("draw", [
    lambda p: puzzles.draw_rows_puzzle(p, program=2, rows=8, s_pad=8),
    lambda p: puzzles.draw_partners_puzzle(p, program=0, rows=8),
    lambda p: puzzles.draw_park_puzzle(p, program=1, groups_per_block=4),
    lambda p: puzzles.draw_row_sum_puzzle(8),
], ids=["rows", "partners", "park", "row_sum"])
def test_the_pictures_keep_the_house_style(draw):
    fig = draw(puzzles.puzzles(0)[0])
    assert fig.get_figwidth() <= MAX_WIDTH and fig.axes
    fig.canvas.draw()  # sizes are known once drawn
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text()]
    assert sizes and min(sizes) >= MIN_FONT


def test_the_park_picture_marks_what_the_program_parks():
    p = puzzles.puzzles(0)[0]
    mine = p.parked_by(0, 4)
    assert mine == {0}  # request slot 0's first pair is pair 0; request slot 1's is pair 4, program 1's
    assert {int(p.slots()[r]) for r in p.parked().values()} == set(range(4))


# --- the same verdict on every run; Triton says nothing about the check's own inputs ------------------


@pytest.mark.parametrize("check, answer", [(c, f) for c, f in SOLUTIONS] + [(c, f) for c, f, _ in WRONG],
                         ids=[f.fn.__name__ for _, f in SOLUTIONS] + [f.fn.__name__ for _, f, _ in WRONG])
def test_a_check_gives_the_same_verdict_every_run(check, answer):
    verdicts = {str(check(answer)) for _ in range(3)}
    assert len(verdicts) == 1, verdicts


def test_the_partner_check_hands_first_and_group_as_booleans():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert wk.check_partners(gather_partners).ok
    assert not [w for w in caught if "non-boolean" in str(w.message)], [str(w.message) for w in caught]


def test_the_checks_run_the_hand_made_edge_cases_before_the_random_batch():
    batches = [p.batch for p in puzzles.puzzles(0)]
    assert "random" in puzzles.puzzles(0)[-1].what and all("random" not in p.what for p in puzzles.puzzles(0)[:-1])
    live = [b.plan(puzzles.RING) for b in batches[:-1]]
    assert any(sum(len(r) for r in b.row_ranges()) < puzzles.RING for b in batches)  # fewer rows than the ring
    assert any(0 in [r.extend_len for r in b.requests] for b in batches)  # a zero-length request
    assert any(len(b.requests) == b.request_slots for b in batches)  # every slot full
    assert any(b.row_ranges()[len(b.requests) - 1].stop == b.num_rows for b in batches)  # ends at the bucket's end
    assert live and [p.what for p in puzzles.puzzles(0)] == [p.what for p in puzzles.puzzles(0)]


def test_the_gpu_words_picture_keeps_the_house_style():
    from c2graph.pictures.draw_fused import draw_gpu_words

    fig = draw_gpu_words()
    assert fig.get_figwidth() <= MAX_WIDTH
    fig.canvas.draw()
    words = " ".join(t.get_text() for t in fig.findobj(Text))
    for word in ("SM 0", "tensor cores", "HBM", "lane 0", "warp", "8 groups per block"):
        assert word in words, word
    assert min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text()) >= MIN_FONT


def test_a_read_outside_the_tensors_is_named_and_triton_is_left_as_it_was():
    from triton.runtime import interpreter

    said = str(wk.check_row_slots(row_slots_unmasked_offsets))
    assert "read offsets_ptr[" in said and "past its last value" in said and "mask=s < request_slots" in said, said
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)  # the check's wrapper is gone


def test_the_worked_request_is_computed_from_the_batch():
    from c2graph.pictures.draw_park import draw_one_request, one_request_steps

    batch = puzzles.puzzles(0)[0].batch
    groups = one_request_steps(batch, puzzles.RING, slot=3, per_program=4, unit="group")
    rows = one_request_steps(batch, puzzles.RING, slot=3, per_program=8, unit="row")
    first = batch.row_ranges()[3].start
    assert groups.number == int(puzzles.puzzles(0)[0].first_pairs()[3]) and groups.program == groups.number // 4
    assert rows.number == first and (rows.program, rows.lane) == (first // 8, first % 8)
    parked = {k: r for r, _, k in groups.parked}
    assert parked == {k: r for k, r in batch.plan(puzzles.RING).parked.items() if r in batch.row_ranges()[3]}
    assert groups.partner == (batch.plan(puzzles.RING).rows[first].partner_ring_row, int(batch.pos[first]) - 1)
    fig = draw_one_request(batch, puzzles.RING, puzzles.POOL_REQUESTS, 3, 4, "group")
    assert fig.get_figwidth() <= MAX_WIDTH
    fig.canvas.draw()
    assert min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text()) >= MIN_FONT
    with pytest.raises(ValueError, match="unit='pairs'"):
        one_request_steps(batch, puzzles.RING, slot=3, per_program=4, unit="pairs")


def test_an_answer_written_with_the_former_name_block_is_launched_by_it():
    """Puzzles 1 and 2 called the rows a program takes ``BLOCK`` before the word came to mean a run
    of pairs alone: an answer that still spells it so is checked on its merits, not refused."""
    former = one_change(row_slots, "row_slots_block", [
        ("ROWS: tl.constexpr", "BLOCK: tl.constexpr"),
        ("tl.program_id(0) * ROWS + tl.arange(0, ROWS)", "tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)")])
    assert wk.check_row_slots(former).ok
    wrong = one_change(former, "row_slots_block_wrong", [("rows[:, None] < ends", "rows[:, None] <= ends")])
    assert not wk.check_row_slots(wrong).ok
