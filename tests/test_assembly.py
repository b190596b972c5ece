"""Notebook 02's assembly: the checks pass the notebook's own solutions, on every run the same, and
name the mistake of each plausible wrong answer (each a small change of the notebook's cell)."""

from __future__ import annotations

import linecache
from pathlib import Path

import nbformat
import pytest

import c2graph  # noqa: F401  (first: without CUDA it sets TRITON_INTERPRET=1 before Triton is imported)
from c2graph.workshop import assembly
from c2graph.workshop.student import find_exercises

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_the_fused_kernel.ipynb"


def solutions() -> dict[str, str]:
    """The notebook's solution cells, by the function each check takes."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return {nb.cells[e.check].source.split("(")[1].rstrip(")"): nb.cells[e.solution].source
            for e in find_exercises(nb, NOTEBOOK.name)}


def namespace(**changed: tuple[str, str]) -> dict:
    """Every solution cell run in order in one namespace; ``changed[name] = (old, new)`` edits that
    function's cell first (the edit must apply)."""
    ns: dict = {"__name__": "__main__"}  # as in a notebook: compiled Triton reads a callee's __module__
    exec("import triton\nimport triton.language as tl", ns)
    for name, source in solutions().items():
        if name in changed:
            old, new = changed[name]
            assert old in source, (name, old)
            source = source.replace(old, new)
        cell = f"<notebook-02-{name}-{len(linecache.cache)}>"
        linecache.cache[cell] = (len(source), None, source.splitlines(keepends=True), cell)
        exec(compile(source, cell, "exec"), ns)
    return ns


@pytest.mark.parametrize("seed", [0, 3])
def test_the_notebooks_assembly_passes_both_checks(seed):
    ns = namespace()
    for check, fn in ((assembly.check_gate_norm, "gate_rms_norm"), (assembly.check_compressor, "my_compressor")):
        result = check(ns[fn], seed=seed)
        assert result.ok, str(result)


def test_the_compressor_check_runs_the_edge_cases_and_says_so():
    said = str(assembly.check_compressor(namespace()["my_compressor"]))
    for case in ("a one-row batch", "fewer than the ring", "a zero-length request", "every request slot full", "the bucket's end",
                 "a random batch (seed 0"):
        assert case in said, case


GATE = "gate_rms_norm"
KERNEL = "my_compressor"
WRONG = [
    (GATE, ("pooled = kv0 * (e0 / (e0 + e1)) + kv1 * (e1 / (e0 + e1))", "pooled = kv0 * (e1 / (e0 + e1)) + kv1 * (e0 / (e0 + e1))"),
     "each kv row took the other row's weight"),
    (GATE, ("return p * inv_rms[:, None] * norm_w[None, :]", "return p"), "not yet normalised"),
    (GATE, ("return p * inv_rms[:, None] * norm_w[None, :]", "return p * inv_rms[:, None]"), "multiply by norm_w"),
    (GATE, ("row_sum(p * p, LOG2_D) / D + eps", "row_sum(p * p, LOG2_D) + eps"), "was not divided by D"),
    (GATE, ("tl.rsqrt(row_sum(p * p, LOG2_D) / D + eps)", "tl.sqrt(row_sum(p * p, LOG2_D) / D + eps)"),
     "RMSNorm divides by it"),
    (KERNEL, ("prev = tl.where(first, ring_ptr + (req * RING + (pos - 1) % RING) * (2 * D), cur - 2 * D)",
              "prev = cur - 2 * D"), "but row 0 is the first row of its request, so its partner"),
    (KERNEL, ("(req * RING + (pos - 1) % RING)", "(req * RING + pos % RING)"), "where this row itself is parked"),
    (KERNEL, ("group = live & (pos % 2 == 1)", "group = live"), "completes no group (pos"),
    (KERNEL, ("prev = tl.where(first, ", "prev = tl.where(live, "), "but row 2 is not the first row of its request"),
    (KERNEL, ("tl.store(latent_ptr + rows[:, None] * D + kv, latent.to(tl.bfloat16), mask=m)", "pass"),
     "was never written"),
    (KERNEL, ("    park(projected_ptr, ring_ptr,", "    pass  # park(projected_ptr, ring_ptr,"),
     "does not call park: step 4 calls your park"),
    (KERNEL, ("offsets_ptr, offsets_ptr, request_slots, 2 * D,", "offsets_ptr, offsets_ptr, request_slots, D,"),
     "pass 2 * D as park's D"),
]
PARK_CALL = ("park(projected_ptr, ring_ptr, pos_ptr, req_ptr, offsets_ptr, offsets_ptr, request_slots, 2 * D, RING, "
             "ROWS, S_PAD)")
MORE_WRONG = [  # the mistakes that were once all sent to the gate, and the reads the notebook forbids
    (KERNEL, ("    cur = projected_ptr + rows * (2 * D)",
              f"    tl.debug_barrier()\n    {PARK_CALL}\n    cur = projected_ptr + rows * (2 * D)"),
     "so the park wrote it there before row"),
    (KERNEL, ("D + cols[None, :]", "cols[None, :]"), "the score is columns D to 2 * D of a | kv | score | row"),
    (KERNEL, ("(req * RING + (pos - 1) % RING) * (2 * D)", "(req * RING + (pos - 1) % RING) * D"),
     "a row of ring is 2 * D values wide"),
    (KERNEL, ("offsets_ptr, offsets_ptr, request_slots, 2 * D,", "offsets_ptr, offsets_ptr + request_slots, request_slots, 2 * D,"),
     "first_pair_ptr=the offsets' first row (the starts)"),
    (KERNEL, ("    tl.debug_barrier()  # 4. the park, after every partner was read\n", ""),
     "parks without tl.debug_barrier() before park(...)"),
    (KERNEL, ("gate_rms_norm(tl.load(prev[:, None] + kv, mask=m), tl.load(prev[:, None] + score, mask=m),",
              "gate_rms_norm(tl.load(prev[:, None] + kv), tl.load(prev[:, None] + score),"),
     "your my_compressor read row 4 of projected_ptr, past its last row (4 rows, 0 to 3)"),
    (KERNEL, ("pos, req = tl.load(pos_ptr + rows, mask=live, other=0), tl.load(req_ptr + rows, mask=live, other=0)",
              "pos, req = tl.load(pos_ptr + rows), tl.load(req_ptr + rows)"),
     "past its last value (4 values, 0 to 3)"),
    (KERNEL, ("(rows[:, None] < ends[None, :])", "(rows[:, None] <= ends[None, :])"), "one past its last row"),
    (KERNEL, ("pos, req = tl.load(pos_ptr + rows, mask=live, other=0), tl.load(req_ptr + rows, mask=live, other=0)\n"
              "    group = live & (pos % 2 == 1)",
              "inside = rows < num_rows\n    pos, req = tl.load(pos_ptr + rows, mask=inside, other=0), "
              "tl.load(req_ptr + rows, mask=inside, other=0)\n    group = pos % 2 == 1"),
     "completes no group (a padding row"),
]


@pytest.mark.parametrize("fn, edit, says", MORE_WRONG, ids=[f"{fn}-more-{i}" for i, (fn, _, _) in enumerate(MORE_WRONG)])
def test_a_mistake_is_blamed_on_its_stage_the_same_way_on_every_run(fn, edit, says):
    ns = namespace(**{fn: edit})
    verdicts = {str(assembly.check_compressor(ns[fn])) for _ in range(3)}
    assert len(verdicts) == 1, verdicts
    said = verdicts.pop()
    assert "FAIL" in said and says in said and "check the gate" not in said, said


@pytest.mark.parametrize("fn, edit, says", WRONG, ids=[f"{fn}-{i}" for i, (fn, _, _) in enumerate(WRONG)])
def test_a_wrong_assembly_is_named_and_gets_the_same_verdict_every_run(fn, edit, says):
    ns = namespace(**{fn: edit})
    check = assembly.check_gate_norm if fn == GATE else assembly.check_compressor
    verdicts = {str(check(ns[fn])) for _ in range(3)}
    assert len(verdicts) == 1, verdicts
    said = verdicts.pop()
    assert "FAIL" in said and says in said, said


def test_an_error_inside_triton_is_reported_at_the_readers_line():
    ns = namespace(my_compressor=("m, kv, score = group[:, None], cols[None, :], D + cols[None, :]",
                                  "m, kv, score = group[:, None], cols[None, :], D + cols[:, None]"))
    said = str(assembly.check_compressor(ns["my_compressor"]))
    assert "your my_compressor failed at `" in said and "__call__" not in said and "InterpreterError" not in said, said


def test_a_function_that_is_no_triton_function_or_has_another_signature_is_named():
    assert "is not a Triton function: decorate it with @triton.jit" in str(assembly.check_gate_norm(lambda *a: None))
    said = str(assembly.check_compressor(namespace()["gate_rms_norm"]))
    assert "gate_rms_norm takes (kv0, s0" in said and "keep the signature" in said
