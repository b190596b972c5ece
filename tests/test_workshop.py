"""The exercises of notebooks 01 and 03 and their checks.

Each check passes on the solution the notebook holds, and reports (never raises) a student's stub
that raises ``NotImplementedError``, naming the function to write, and every plausible wrong
solution listed here, naming its mistake: a wrong dtype, a wrong device, a rule broken at a named
row, a capture refused in words that name the cause and the reader's function and line, a cache or
ring row never written or written wrong. Notebook 01's functions and their copies in
``c2graph.workshop.my_compressor`` are the same code, and compute what the library's torch path
computes.
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import POISON, make_case, ragged_requests

import c2graph as c2
from c2graph.graphs.refusals import NOT_PERMITTED
from c2graph.measure.compare import compare_pools
from c2graph.workshop import CheckResult
from c2graph.workshop import my_compressor as wc
from c2graph.workshop import my_graph as wg
from c2graph.workshop import setup_check
from c2graph.workshop.practice import StaticBatch, capture_yours, refusal_words
from c2graph.workshop.student import student_copy
from c2graph.workshop.yours import NAMES, load_yours

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WORKSHOP = ("01_the_ratio2_compressor.ipynb", "03_cuda_graphs_and_broken_offsets.ipynb")


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def source(cell: dict) -> str:
    return "".join(cell["source"])


def exercises(name: str) -> list[tuple[str, str]]:
    """``(solution source, check source)`` of each exercise, in notebook order."""
    nb = cells(name)
    return [(source(nb[i + 1]), source(nb[i + 2])) for i, c in enumerate(nb) if "exercise" in tags(c)]


def namespace() -> dict:
    """What a notebook's solution and check cells can see: torch and the workshop modules."""
    ns: dict = {}
    exec("import torch\nfrom c2graph.workshop.my_compressor import *\nfrom c2graph.workshop.my_graph import *", ns)
    return ns


def stubbed(solution: str) -> str:
    """The student copy of a solution cell: each function keeps its signature and docstring, and raises."""
    tree = ast.parse(solution)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            doc = node.body[:1] if ast.get_docstring(node) else []
            node.body = doc + [ast.parse("raise NotImplementedError('write this function')").body[0]]
    return ast.unparse(tree)


ALL_EXERCISES = [(name, i) for name in WORKSHOP for i in range(len(exercises(name)))]


def test_every_exercise_has_a_solution_and_one_check_call():
    assert [len(exercises(name)) for name in WORKSHOP] == [3, 2]
    for name in WORKSHOP:
        for solution, check in exercises(name):
            assert all(isinstance(n, ast.FunctionDef) and ast.get_docstring(n) for n in ast.parse(solution).body)
            call = ast.parse(check).body
            assert len(call) == 1 and isinstance(call[0].value, ast.Call), check
            assert call[0].value.func.id.startswith("check_")


@pytest.mark.parametrize("name, index", ALL_EXERCISES)
def test_check_passes_on_the_notebooks_solution(name, index):
    solution, check = exercises(name)[index]
    ns = namespace()
    exec(solution, ns)
    result = eval(check, ns)
    assert isinstance(result, CheckResult) and result.ok, str(result)


@pytest.mark.parametrize("name, index", ALL_EXERCISES)
def test_check_reports_a_stub_without_raising(name, index):
    solution, check = exercises(name)[index]
    ns = namespace()
    exec(stubbed(solution), ns)
    result = eval(check, ns)
    assert isinstance(result, CheckResult) and not result.ok
    names = [n.name for n in ast.parse(solution).body if isinstance(n, ast.FunctionDef)]
    assert f"your function `{names[0]}` is not written yet" in str(result), str(result)


# --- plausible wrong solutions, one or two per check ---------------------------------------------


def partner_ignoring_req(batch):
    """The previous row at pos - 1 is taken as the partner, whatever its request."""
    partner = torch.zeros_like(batch.pos, dtype=torch.bool)
    partner[1:] = (batch.raw_out_loc[1:] != 0) & (batch.pos[1:] == batch.pos[:-1] + 1)
    return partner


def partner_by_roll(batch):
    """Compares each row with ``roll(1)`` of the tensors, without the previous row's liveness: row 0
    wraps round onto the last row, and a padding row there (req 0, pos 0) looks like a partner."""
    live = batch.raw_out_loc != 0
    return live & (batch.req == batch.req.roll(1)) & (batch.pos == batch.pos.roll(1) + 1)


def partner_misaligned(batch):
    """Writes rows 1.. with a rule one row short: the two sides have different lengths, and torch raises."""
    live = batch.raw_out_loc != 0
    partner = torch.zeros_like(live)
    partner[1:] = live[2:] & live[1:-1] & (batch.req[2:] == batch.req[1:-1])
    return partner


def partner_without_live(batch):
    """The rule without liveness: past the live rows it cannot go wrong (padding sits at pos 0, in no
    request), but the dummy batch a graph is captured on pairs its padding rows."""
    partner = torch.zeros_like(batch.pos, dtype=torch.bool)
    partner[1:] = (batch.req[1:] == batch.req[:-1]) & (batch.pos[1:] == batch.pos[:-1] + 1)
    return partner


def partner_one_row_short(batch):
    """The rule for rows 1.. returned as it is: one value short of one per row."""
    live = batch.raw_out_loc != 0
    return live[1:] & live[:-1] & (batch.req[1:] == batch.req[:-1]) & (batch.pos[1:] == batch.pos[:-1] + 1)


def partner_as_int64(batch):
    """The right rule in a tensor of ints: `~` of it gives -1 and -2, and my_pair would crash on it."""
    return wc.my_previous_is_partner(batch).long()


def partner_on_the_cpu(batch):
    """The right rule, moved to the host: on a GPU the batch's tensors are on cuda."""
    return wc.my_previous_is_partner(batch).cpu()


def ring_rows_of_own_pos(batch, prev_is_partner, ring_size, sentinel):
    """Reads the ring row of the row's own position instead of its partner's."""
    needs = (batch.raw_out_loc != 0) & (batch.pos % 2 == 1) & ~prev_is_partner
    return torch.where(needs, batch.req * ring_size + batch.pos % ring_size, sentinel)


def ring_rows_for_even_rows_too(batch, prev_is_partner, ring_size, sentinel):
    """Forgets that even rows complete nothing: every first row of a request reads the ring."""
    needs = (batch.raw_out_loc != 0) & ~prev_is_partner
    return torch.where(needs, batch.req * ring_size + (batch.pos - 1) % ring_size, sentinel)


def ring_rows_without_live(batch, prev_is_partner, ring_size, sentinel):
    """Every odd row without a partner in the batch reads the ring, padding included: the dummy
    batch's odd rows read ring rows."""
    needs = (batch.pos % 2 == 1) & ~prev_is_partner
    return torch.where(needs, batch.req * ring_size + (batch.pos - 1) % ring_size, sentinel)


def ring_rows_as_int32(batch, prev_is_partner, ring_size, sentinel):
    return wc.my_ring_read_rows(batch, prev_is_partner, ring_size, sentinel).int()


def park_mask_from_host(batch, ring_size):
    """Right when run eagerly, but decided on the host: ``mask[row] = True`` copies a host number
    to the device, which a capture refuses (CUDA and the emulation alike)."""
    mask = torch.zeros(batch.num_rows, dtype=torch.bool, device=batch.pos.device)
    for rows in batch.row_ranges():
        for row in rows[-ring_size:]:
            mask[row] = True
    return mask


def park_mask_from_host_slices(batch, ring_size):
    """Decided on the host with slices: no copy, so the capture accepts it, and freezes the dummy's mask."""
    mask = torch.zeros_like(batch.pos, dtype=torch.bool)
    for rows in batch.row_ranges():
        mask[rows[-ring_size:].start:rows.stop] = True
    return mask


def park_mask_by_boolean_indexing(batch, ring_size):
    """Selects the live rows with a boolean mask: a host sync."""
    mask = torch.zeros_like(batch.pos, dtype=torch.bool)
    rows = torch.arange(batch.num_rows, device=batch.pos.device)[batch.raw_out_loc != 0]
    mask[rows] = True
    return mask & wc.my_park_mask(batch, ring_size)


def park_mask_by_shifted_copies(batch, ring_size):
    """The row ring_size further on, by shifted copies padded with ring_size fill values: right for
    every batch of at least ring_size rows, and ring_size values long for a batch of fewer."""
    live = batch.raw_out_loc != 0
    fill = torch.full((ring_size,), -1, device=batch.pos.device)
    later_req, later_pos = torch.cat([batch.req[ring_size:], fill]), torch.cat([batch.pos[ring_size:], fill])
    later_live = torch.cat([live[ring_size:], fill == 0])
    return live & ~(later_live & (later_req == batch.req) & (later_pos == batch.pos + ring_size))


def park_mask_without_live(batch, ring_size):
    """The last ring_size rows of every run of one request, padding rows included."""
    T = batch.num_rows
    ahead = (torch.arange(T, device=batch.pos.device) + ring_size).clamp(max=max(T - 1, 0))
    inside = torch.arange(T, device=batch.pos.device) + ring_size < T
    return ~(inside & (batch.req[ahead] == batch.req) & (batch.pos[ahead] == batch.pos + ring_size))


def park_mask_one_too_many(batch, ring_size):
    """Parks each request's last ring_size + 1 rows."""
    return wc.my_park_mask(batch, ring_size + 1)


def store_every_slot(pools, latent, key, batch, layer):
    """Stores every row at raw_out_loc // 2: even rows write their group's c2 slot too."""
    slots = batch.raw_out_loc // 2
    pools.kv_cache[slots] = wc.my_rope(latent, batch.pos - batch.pos % 2, layer.inv_freq)
    pools.index_k[slots] = key


def store_rope_at_pos(pools, latent, key, batch, layer):
    """RoPE at the row's own pos instead of its group position."""
    pools.kv_cache[batch.c2_slot] = wc.my_rope(latent, batch.pos, layer.inv_freq)
    pools.index_k[batch.c2_slot] = key


def store_forgets_the_key(pools, latent, key, batch, layer):
    pools.kv_cache[batch.c2_slot] = wc.my_rope(latent, batch.pos - batch.pos % 2, layer.inv_freq)


def store_rebinds_the_cache(pools, latent, key, batch, layer):
    """Builds a new cache with index_put and rebinds the name: the cache it was given is never written."""
    pools.kv_cache = pools.kv_cache.index_put((batch.c2_slot,), wc.my_rope(latent, batch.pos - batch.pos % 2, layer.inv_freq))
    pools.index_k[batch.c2_slot] = key


def park_without_restoring_the_sentinel(ring, kv, score, batch, ring_size):
    """Sends the rows it does not park to the sentinel, and leaves the sentinel dirty."""
    rows = torch.where(wc.my_park_mask(batch, ring_size), batch.req * ring_size + batch.pos % ring_size, ring.shape[0] - 1)
    ring[rows] = torch.cat([kv, score], 1)


def park_at_the_partners_ring_row(ring, kv, score, batch, ring_size):
    """Parks at (pos - 1) % ring_size, the read rule's row: each row lands where its neighbour belongs."""
    sentinel, D = ring.shape[0] - 1, kv.shape[1]
    rows = torch.where(wc.my_park_mask(batch, ring_size), batch.req * ring_size + (batch.pos - 1) % ring_size, sentinel)
    ring[rows] = torch.cat([kv, score], 1)
    ring[sentinel, :D], ring[sentinel, D:] = 0.0, float("-inf")


def park_the_previous_rows_values(ring, kv, score, batch, ring_size):
    """The right ring rows, each given the previous batch row's | kv | score |."""
    sentinel = ring.shape[0] - 1
    rows = torch.where(wc.my_park_mask(batch, ring_size), batch.req * ring_size + batch.pos % ring_size, sentinel)
    ring[rows] = torch.cat([kv, score], 1).roll(1, 0)
    ring[sentinel] = torch.cat([torch.zeros_like(kv[0]), torch.full_like(score[0], float("-inf"))])


HOST_DECISION = "decided on the host"


def refused_at(fn, code: str) -> str:
    """The start of the words of a capture refused at ``code``, a line of ``fn``: its name, file, line number and code."""
    lines, first = inspect.getsourcelines(fn)
    number = first + next(i for i, line in enumerate(lines) if line.strip() == code)
    return f"the capture refused your function `{fn.__name__}` ({Path(inspect.getfile(fn)).name}:{number}: `{code}`): "


WRONG = [
    (wc.check_previous_is_partner, partner_ignoring_req, "belongs to request slot"),
    (wc.check_previous_is_partner, partner_as_int64, "dtype torch.int64; expected torch.bool"),
    (wc.check_previous_is_partner, partner_without_live, "the dummy batch a graph is captured on: one request over "
     "all 16 rows, every row padding (requests [(0, 0, 16)]): 15 of 16 rows differ: row 1 (padding): yours says True, "
     "the rule says False: it is padding (`raw_out_loc == 0`): a padding row has no partner"),
    (wc.check_previous_is_partner, partner_one_row_short, "has shape (0,); expected (1,): one value per row"),
    (wc.check_previous_is_partner, partner_by_roll, "`roll(1)` brings the last row, row 7, padding, round to row 0"),
    (wc.check_previous_is_partner, partner_misaligned,
     "(at `partner[1:] = live[2:] & live[1:-1] & (batch.req[2:] == batch.req[1:-1])`) raised RuntimeError: "),
    (wc.check_ring_read_rows, ring_rows_of_own_pos, "the ring row of the row's own pos"),
    (wc.check_ring_read_rows, ring_rows_for_even_rows_too, "the sentinel"),
    (wc.check_ring_read_rows, ring_rows_without_live, "8 of 16 rows differ: row 1 (padding): yours reads 0, the rule "
     "says the sentinel (12): it is padding (`raw_out_loc == 0`), which reads no partner"),
    (wc.check_ring_read_rows, ring_rows_as_int32, "dtype torch.int32; expected torch.int64"),
    (wc.check_park_mask, park_mask_from_host,
     refused_at(park_mask_from_host, "mask[row] = True") + "a copy between the host and the device"),
    (wc.check_park_mask, park_mask_from_host_slices, HOST_DECISION),
    (wc.check_park_mask, park_mask_by_boolean_indexing,
     refused_at(park_mask_by_boolean_indexing, "rows = torch.arange(batch.num_rows, device=batch.pos.device)"
                "[batch.raw_out_loc != 0]") + "a host sync"),
    (wc.check_park_mask, park_mask_one_too_many, "rows differ"),
    (wc.check_park_mask, park_mask_without_live, "row 5 (padding): yours says True, the rule says False: it is padding "
     "(`raw_out_loc == 0`), never parked"),
    (wc.check_park_mask, park_mask_by_shifted_copies, "has shape (2,); expected (1,): one value per row of the batch, "
     "padding rows included (this batch has 1 row, fewer than the ring's 2"),
    # on a GPU the even and the odd row's writes to one c2 slot land in either order: the eager run
    # may already hold the even row's values
    (wg.check_store_graph_safe, store_every_slot, ("nothing should be stored there", "written wrong")),
    (wg.check_store_graph_safe, store_rope_at_pos, "kv_cache c2 slot"),
    (wg.check_store_graph_safe, store_forgets_the_key, "index_k c2 slot"),
    (wg.check_store_graph_safe, store_rebinds_the_cache, "`pools.kv_cache` is a new tensor"),
    (wg.check_store_graph_safe, wc.my_store, refused_at(wc.my_store, "slots = batch.raw_out_loc[groups] // 2") + "a host sync"),
    (wg.check_park_graph_safe, park_without_restoring_the_sentinel, "the sentinel: not restored"),
    (wg.check_park_graph_safe, park_at_the_partners_ring_row, "written"),
    (wg.check_park_graph_safe, wc.my_park, "replayed on"),
]


RUNS = 3
"""Each check runs this many times on the same answer: the verdict and its words must not change."""


@pytest.mark.parametrize("check, solution", [(wc.check_previous_is_partner, wc.my_previous_is_partner),
                                             (wc.check_ring_read_rows, wc.my_ring_read_rows),
                                             (wc.check_park_mask, wc.my_park_mask)])
def test_check_passes_a_solution_the_same_way_in_every_run(check, solution):
    texts = [str(check(solution)) for _ in range(RUNS)]
    assert texts == [texts[0]] * RUNS and texts[0].split("\n")[0].endswith(": pass"), texts
    assert ("the dummy batch (padding inside a request)" in texts[0]) == (check is not wc.check_park_mask), texts[0]


@pytest.mark.parametrize("check, wrong, says", WRONG, ids=[w.__name__ for _, w, _ in WRONG])
def test_check_reports_a_wrong_solution_the_same_way_in_every_run(check, wrong, says):
    texts = [str(check(wrong)) for _ in range(RUNS)]
    for text in texts:
        assert text.split("\n")[0].endswith(": not yet"), text
        assert any(s in text for s in ((says,) if isinstance(says, str) else says)), text
        assert "Cannot copy between CPU and CUDA" not in text and "InterpreterError" not in text, text
    if isinstance(says, str):  # a tuple: on a GPU two writes to one slot land in either order
        assert texts == [texts[0]] * RUNS, texts


def counts_on_the_host(batch):
    """A reader's helper: reads the live row count back to the host, a host sync."""
    return int((batch.raw_out_loc != 0).sum().item())


def park_mask_with_a_host_count(batch, ring_size):
    """Calls a helper of its own that syncs: the refusal names the helper's line, then this function."""
    live = counts_on_the_host(batch)
    return torch.arange(batch.num_rows, device=batch.pos.device) < live


def test_a_refused_capture_names_the_readers_function_its_line_and_its_callers():
    static = StaticBatch(16, 4, device=c2.DEFAULT_DEVICE)
    got = capture_yours(lambda: park_mask_from_host(static.batch, 2))
    assert got.graph is None and not got.raised and got.function == "park_mask_from_host", got
    assert got.code == "mask[row] = True" and got.where.startswith("test_workshop.py:"), got
    words = refusal_words(got)  # this test's lambda is outside the package: the reader's code too
    assert words.startswith(refused_at(park_mask_from_host, "mask[row] = True")[:-2] + ", called from `<lambda>`: "
                            "a copy between the host and the device"), words

    got = capture_yours(lambda: park_mask_with_a_host_count(static.batch, 2))
    assert got.error == NOT_PERMITTED and got.message == NOT_PERMITTED and got.function == "counts_on_the_host", got
    code = "return int((batch.raw_out_loc != 0).sum().item())"
    words = refusal_words(got)
    assert words.startswith(refused_at(counts_on_the_host, code)[:-2] + ", called from `park_mask_with_a_host_count`, "
                            "called from `<lambda>`: a host sync (CUDA error 900"), words


def test_an_error_the_readers_function_raises_only_under_capture_is_named_by_its_type():
    calls = []

    def fails_when_captured():
        calls.append(1)
        if len(calls) > 1:  # the warm-up passes, the capture's call raises
            raise RuntimeError("shape mismatch in my code\nmore")
        return torch.zeros(2, device=c2.DEFAULT_DEVICE)

    got = capture_yours(fails_when_captured)
    assert got.raised and got.error == "RuntimeError: shape mismatch in my code" and got.message == "shape mismatch in my code"
    words = refusal_words(got)
    assert words.startswith("your function `fails_when_captured` (test_workshop.py:") and "`raise RuntimeError(" in words
    assert "raised RuntimeError: shape mismatch in my code during the capture. " in words, words


def test_an_error_of_the_warm_up_is_raised_not_called_a_refusal():
    def always_fails():
        raise RuntimeError("broken before any capture")

    with pytest.raises(RuntimeError, match="broken before any capture"):
        capture_yours(always_fails)
    got = capture_yours(lambda: torch.ones(3, device=c2.DEFAULT_DEVICE) * 2)
    assert got.error is None and got.graph is not None
    got.graph.replay()  # on a GPU a captured output holds garbage until the first replay
    assert got.out.tolist() == [2.0] * 3


def test_an_error_inside_torch_is_reported_at_the_readers_line_with_what_to_change():
    text = str(wc.check_previous_is_partner(partner_misaligned))
    assert "your function `partner_misaligned`" in text and "slices on both sides must cover the same rows" in text, text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a result on another device needs a second device: CUDA")
def test_a_result_on_the_host_is_named_with_its_device():
    result = wc.check_previous_is_partner(partner_on_the_cpu)
    assert not result.ok and "is on cpu; the batch's tensors are on cuda" in str(result), str(result)


def test_the_store_check_names_the_cache_the_slot_and_the_kind_of_mistake():
    text = str(wg.check_store_graph_safe(store_rope_at_pos))
    assert "kv_cache c2 slot" in text and "written wrong" in text and "index_k is right there" in text, text
    text = str(wg.check_store_graph_safe(store_forgets_the_key))
    assert "index_k c2 slot" in text and f"never written (still the poison {POISON:g})" in text, text


def test_the_park_check_tells_never_written_from_written_wrong():
    text = str(wg.check_park_graph_safe(wc.my_park))  # replays the dummy's rows, never the batch's
    assert "never written" in text and "written, but this batch parks nothing there" in text, text
    text = str(wg.check_park_graph_safe(park_the_previous_rows_values))
    assert "written wrong: it holds row" in text, text


@pytest.mark.parametrize("check", [wc.check_previous_is_partner, wc.check_ring_read_rows, wc.check_park_mask,
                                   wg.check_store_graph_safe, wg.check_park_graph_safe])
def test_check_reports_a_function_that_returns_the_wrong_thing(check):
    result = check(lambda *args: None)
    assert isinstance(result, CheckResult) and not result.ok


def test_a_failed_row_check_draws_the_rows_that_differ():
    result = wc.check_previous_is_partner(partner_ignoring_req)
    assert result.figure is not None and result.figure.axes


# --- notebook 01's functions, built once in the library -------------------------------------------


def notebook_functions(name: str) -> dict[str, ast.FunctionDef]:
    found = {}
    for cell in cells(name):
        if cell["cell_type"] != "code":
            continue
        text = "\n".join(line for line in source(cell).splitlines() if not line.startswith(("%", "!")))
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("my_"):
                found[node.name] = node
    return found


def test_notebook_01s_functions_are_the_librarys_copies():
    in_notebook = notebook_functions(WORKSHOP[0])
    in_library = {n: f for n, f in vars(wc).items() if n.startswith("my_") and inspect.isfunction(f)}
    # the one-request pairing of step 2 is a stepping stone, not part of the compressor
    assert set(in_notebook) - {"my_pair_one_request"} == set(in_library)
    for name, fn in in_library.items():
        library = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        assert ast.dump(in_notebook[name]) == ast.dump(library), name


def test_notebook_03_runs_the_readers_own_functions_from_notebook_01():
    text = "".join(source(c) for c in cells(WORKSHOP[1]))
    assert "load_yours(" in text and '"01_the_ratio2_compressor.ipynb"' in text


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(ragged_requests(), min_size=1, max_size=3), pad=st.integers(0, 5),
       seed=st.integers(0, 2**16))
def test_my_compress_equals_the_torch_path_bitwise(batches, pad, seed):
    layer, alloc, pools = make_case(seed=seed, use_fused_gate=False)
    theirs = pools.clone()
    for i, requests in enumerate(batches):
        live = sum(n for *_, n in requests)
        batch = c2.ExtendBatch.build(requests, alloc, pad_to=live + pad)
        x = layer.random_hidden(batch.num_rows, seed=seed + i)
        wc.my_compress(layer, x, batch, pools)
        c2.compress_torch(layer, *c2.project(layer, x), batch, theirs)
        assert all(compare_pools(pools, theirs)), requests
    written = (pools.kv_cache.float() != POISON).any(dim=1)
    written[0] = False
    assert written.nonzero().flatten().tolist() == sorted(
        {s for r in batches for s in c2.ExtendBatch.build(r, alloc).stored_slots})


# --- notebook 00's set-up check -----------------------------------------------------------------


def test_the_setup_check_says_ready_in_one_line_on_this_machine():
    report = setup_check.check_setup()
    assert report.ok and str(report).startswith("ready: ") and "\n" not in str(report), str(report)


def test_the_setup_check_names_a_wrong_python_or_package_and_how_to_fix_it():
    ok = {name: setup_check.pinned_versions().get(name, "99.0") for name in setup_check.NEEDED}  # torch, triton: bounded
    assert setup_check.version_problems(python="3.12.1", installed=ok) == []
    (python,) = setup_check.version_problems(python="3.10.4", installed=ok)
    assert python.startswith("Python 3.10.4 runs this notebook, c2graph needs Python >=3.11") and "python3" in python
    old_torch, no_triton = setup_check.version_problems(installed={**ok, "torch": "2.5.1+cpu", "triton": None})
    assert old_torch.startswith("torch 2.5.1+cpu is installed, c2graph needs torch>=") and "make lab" in old_torch
    assert no_triton.startswith("triton is not installed: run `make lab`")
    report = setup_check.SetupReport([old_torch, no_triton])
    assert not report.ok and str(report).startswith("not ready: torch 2.5.1+cpu") and "\n" not in str(report)


def test_the_setup_check_names_triton_imported_too_early(monkeypatch):
    monkeypatch.setattr(setup_check._runtime, "HAS_CUDA", False)
    monkeypatch.setattr(setup_check._runtime, "INTERPRET", False)
    assert "restart the kernel and run `import c2graph` first" in setup_check.triton_problem()


def test_the_setup_check_reports_a_kernel_or_a_graph_that_fails(monkeypatch):
    assert setup_check.triton_problem() is None and setup_check.graph_problem() is None

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no backend for this device\nmore")

    class NoGraph:
        def __init__(self):
            raise RuntimeError("capture is not supported here")

    monkeypatch.setattr(setup_check, "_add_one", Broken())
    monkeypatch.setattr(setup_check, "Graph", NoGraph)
    assert setup_check.triton_problem() == (
        f"a Triton kernel failed (RuntimeError: no backend for this device): {setup_check.FIX_VERSIONS}")
    assert setup_check.graph_problem().startswith("a graph capture and replay failed (RuntimeError: capture is not")
    assert str(setup_check.check_setup()).startswith("not ready: a Triton kernel failed")


def test_the_setup_check_reads_pyproject_where_c2graph_is_not_installed(monkeypatch):
    def missing(name):
        raise setup_check.metadata.PackageNotFoundError(name)

    installed = setup_check.declared_requirements()
    monkeypatch.setattr(setup_check.metadata, "metadata", missing)
    assert setup_check.declared_requirements() == installed


# --- notebook 03 runs the reader's own functions ------------------------------------------------


def notebook_01_with(tmp_path, replace: dict[str, str] | None = None, student: bool = False) -> Path:
    """Notebook 01 saved to ``tmp_path``: its student copy, or with some functions' source replaced."""
    nb = nbformat.read(NOTEBOOKS / WORKSHOP[0], as_version=4)
    if student:
        nb = student_copy(nb)
    for cell in nb.cells:
        for old, new in (replace or {}).items():
            if cell.cell_type == "code" and old in cell.source:
                cell.source = cell.source.replace(old, new)
    path = tmp_path / WORKSHOP[0]
    nbformat.write(nb, path)
    return path


def test_notebook_03_runs_every_function_of_the_full_notebook_01():
    found = load_yours(NOTEBOOKS / WORKSHOP[0])
    assert not found.fallbacks and str(found).startswith(f"from {WORKSHOP[0]}: yours: my_project,"), str(found)
    assert all(f.__module__ != wc.__name__ for f in found.functions.values())  # not the library's copies
    assert inspect.getsource(found.functions["my_store"]).startswith("def my_store(")  # 03 prints its diff


def test_notebook_03_falls_back_to_the_reference_for_each_stub_and_says_so(tmp_path):
    found = load_yours(notebook_01_with(tmp_path, student=True))
    assert set(found.fallbacks) == {"my_previous_is_partner", "my_ring_read_rows", "my_park_mask"}
    assert "my_previous_is_partner, my_ring_read_rows, my_park_mask: not written yet" in str(found)
    assert found.functions["my_park_mask"] is wc.my_park_mask
    assert found.functions["my_compress"].__module__ != wc.__name__  # the reader's, calling the reference rules


def test_notebook_03_falls_back_for_an_exercise_whose_check_fails(tmp_path):
    path = notebook_01_with(tmp_path, {"torch.arange(T, device=batch.pos.device) + ring_size":
                                       "torch.arange(T, device=batch.pos.device) + ring_size + 1"})
    found = load_yours(path)
    assert list(found.fallbacks) == ["my_park_mask"], str(found)
    assert found.fallbacks["my_park_mask"].startswith("its check (check_park_mask) does not pass yet: FAIL: "), str(found)
    assert "rows differ" in found.fallbacks["my_park_mask"], str(found)


HELPER = """SHIFT = 1


def same_request_as_previous(batch, live):
    \"\"\"[T - SHIFT] bool: row i and row i - 1 are both live, of one request, at consecutive positions.\"\"\"
    return (live[SHIFT:] & live[:-SHIFT] & (batch.req[SHIFT:] == batch.req[:-SHIFT])
            & (batch.pos[SHIFT:] == batch.pos[:-SHIFT] + SHIFT))


def my_previous_is_partner(batch):"""


def test_notebook_03_brings_the_readers_helper_functions_and_constants_along(tmp_path):
    path = notebook_01_with(tmp_path, {
        "def my_previous_is_partner(batch):": HELPER,
        "    partner[1:] = (live[1:] & live[:-1] & (batch.req[1:] == batch.req[:-1])\n"
        "                   & (batch.pos[1:] == batch.pos[:-1] + 1))": "    partner[1:] = same_request_as_previous(batch, live)"})
    assert "same_request_as_previous(batch, live)" in path.read_text()
    found = load_yours(path)
    assert not found.fallbacks, str(found)
    assert found.functions["my_previous_is_partner"].__module__ != wc.__name__


def test_notebook_03_names_exactly_the_name_a_function_uses_and_notebook_01_does_not_define(tmp_path):
    path = notebook_01_with(tmp_path, {
        "ahead = torch.arange(T, device=batch.pos.device) + ring_size": "ahead = torch.arange(T, device=batch.pos.device) + RING",
        "def my_park_mask(batch, ring_size):": "RING = cfg.ring_size\n\n\ndef my_park_mask(batch, ring_size):"})
    found = load_yours(path)
    assert list(found.fallbacks) == ["my_park_mask"], str(found)
    assert found.fallbacks["my_park_mask"].startswith(
        "it uses `RING`, which notebook 01 does not define at the top level of a code cell"), str(found)


def test_notebook_03_falls_back_everywhere_when_the_readers_compressor_differs(tmp_path):
    path = notebook_01_with(tmp_path, {"return kv_prev * w0 + kv * w1, w0": "return kv_prev * w1 + kv * w0, w0"})
    found = load_yours(path)
    assert set(found.fallbacks) == set(NAMES) and "your my_compress differs from the torch path (kv_cache: FAIL" in str(found)
    assert all(f is getattr(wc, name) for name, f in found.functions.items())
    missing = load_yours(tmp_path / "elsewhere.ipynb")
    assert set(missing.fallbacks) == set(NAMES) and "was not found next to this notebook" in str(missing)


def test_notebook_03_falls_back_when_the_readers_cells_cannot_be_defined(tmp_path):
    path = notebook_01_with(tmp_path, {"def my_gate(kv_prev, score_prev, kv, score):":
                                       "def my_gate(kv_prev, score_prev, kv, score=undefined_name):"})
    found = load_yours(path)
    assert set(found.fallbacks) == set(NAMES) and "defining your functions raised NameError" in str(found), str(found)


def test_the_hand_made_cases_hold_every_edge_the_checks_promise():
    from c2graph.workshop.practice import HAND_MADE, practice_batches
    from c2graph.workshop.practice import check_rng

    cfg = c2.Config.tiny()
    eager = [b for _, b in practice_batches(cfg, check_rng(), 0)]
    padded = [b for _, b in practice_batches(cfg, check_rng(), 0, bucket=16, request_slots=4)]
    assert len(eager) == len(padded) == len(HAND_MADE)
    assert any(b.num_rows < cfg.ring_size and b.live_rows for b in eager), "fewer rows than the ring"
    assert any(b.requests and b.requests[0].pool_index == 0 and b.requests[0].prefix_len % 2
               and b.num_rows > b.live_rows for b in eager), "row 0 at an odd pos of req 0, padding (req 0) last"
    assert any(r.extend_len == 0 for b in eager for r in b.requests[:-1]), "a request of 0 rows"
    assert any(not b.requests for b in eager), "an idle rank"
    assert any(len(b.requests) == 4 for b in padded), "every one of the graph's 4 request slots full"
    assert any(b.live_rows == b.num_rows == 16 for b in padded), "the last request ending at the bucket's end"


def test_notebook_01s_checks_try_the_dummy_batch_after_the_hand_made_ones():
    """The one batch with padding inside a request, at odd positions: where a rule without `live` goes wrong."""
    from c2graph.workshop.practice import HAND_MADE, check_rng

    what, dummy = wc._batches(c2.Config.tiny(), check_rng())[len(HAND_MADE)]
    assert what == wc.DUMMY and dummy.requests and not (dummy.raw_out_loc != 0).any()
    assert (dummy.pos % 2 == 1).any() and len(dummy.requests) == 1


def test_a_check_draws_the_same_batches_in_every_run():
    from c2graph.workshop.practice import check_rng, practice_batches

    cfg = c2.Config.tiny()
    runs = [[(what, b.requests) for what, b in practice_batches(cfg, check_rng())] for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_compiled_triton_error_says_its_message_and_the_kernels_line():
    from c2graph.workshop.check import raised_words

    CompilationError = type("CompilationError", (Exception,), {})  # compiled Triton's, as a GPU raises it
    error = CompilationError("at 4:11:\n    offs = first_row + tl.arange(0, BLOCK)\n           ^\n"
                             "IncompatibleTypeErrorImpl('invalid operands of type pointer<fp32> and pointer<int64>')")
    text = raised_words(error)
    assert "CompilationError: IncompatibleTypeErrorImpl('invalid operands of type pointer<fp32> and pointer<int64>') " \
           "(line 4 of the kernel, its `def` line counted as 1)" in text, text
    assert "Pass tensors only to `*_ptr` arguments" in text, text


def test_a_name_from_a_star_import_is_not_called_missing(tmp_path):
    path = notebook_01_with(tmp_path, {
        "ahead = torch.arange(T, device=batch.pos.device) + ring_size":
            "ahead = torch.arange(T, device=batch.pos.device) + floor(ring_size)",
        "def my_park_mask(batch, ring_size):": "from math import *\n\n\ndef my_park_mask(batch, ring_size):"})
    found = load_yours(path)
    assert not found.fallbacks, str(found)
