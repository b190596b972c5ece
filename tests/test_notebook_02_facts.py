"""Numbers and counts that notebook 02's prose states, checked against what its cells compute.

The prose is read from the notebook; the numbers from its committed outputs (which nbval checks
against a fresh run) or from the library, so a change of either that makes a sentence false fails
here.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import c2graph as c2
from c2graph.compressor.fused import SMALL_BUCKET_ROWS, kernel_blocks
from c2graph.workshop.puzzles import puzzles

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_the_fused_kernel.ipynb"


@pytest.fixture(scope="module")
def nb():
    return nbformat.read(NOTEBOOK, as_version=4)


def prose(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown").replace("\n", " ")


def output_of(nb, source_part: str) -> str:
    cells = [c for c in nb.cells if c.cell_type == "code" and source_part in c.source]
    assert len(cells) == 1, source_part
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cells[0].outputs)


def test_about_160_launches_is_the_counted_total(nb):
    total = int(re.search(r"^total\s+(\d+)", output_of(nb, "torch_ops.table"), re.M).group(1))
    assert "About 160 launches" in prose(nb) and "made about 160 launches" in prose(nb)
    assert abs(total - 160) <= 0.05 * 160, total
    moved = output_of(nb, "big_ops.total_bytes / 2**20:8.2f")
    assert f"in {total} launches" in moved  # the same count at dsv41


def test_the_torch_path_moves_about_36_times_the_minimum(nb):
    out = output_of(nb, "big_ops.total_bytes / 2**20:8.2f")
    minimum = float(re.search(r"minimum, in all \(computed\)\s+([\d.]+)", out).group(1))
    torch_mib = float(re.search(r"torch path \(sum of its ops\)\s+([\d.]+)", out).group(1))
    assert "about 36 times the minimum" in prose(nb)
    assert round(torch_mib / minimum) == 36


def test_groups_per_block_as_the_prose_says(nb):
    text = prose(nb)
    assert "8 pairs per block at `tiny`; at `dsv41`, 8 in buckets of up to 4096 rows and 16 above" in text
    assert SMALL_BUCKET_ROWS == 4096
    tiny, big = c2.Config.tiny(), c2.Config.dsv41()
    assert kernel_blocks(tiny.D, 40).groups_per_block == 8
    assert kernel_blocks(big.D, 4096).groups_per_block == 8 and kernel_blocks(big.D, 4097).groups_per_block == 16


def test_the_batch_and_its_ring_reads_as_the_prose_says(nb):
    text = prose(nb)
    assert "padded to a bucket of 40 rows with 6 request slots" in text
    cfg = c2.Config.tiny()
    alloc = c2.ReqToTokenPool(cfg, pool_requests=6, max_seq_len=96, seed=0)
    batch = c2.ExtendBatch.build([(0, 5, 7), (3, 0, 15), (1, 3, 1), (4, 9, 12)], alloc, request_slots=6, pad_to=40)
    plan = batch.plan(cfg.ring_size)
    assert "three solid arrows from the ring (requests 0, 1 and 4 start at odd positions)" in text
    ring_reads = [r for r in plan.rows if r.partner is c2.Partner.RING]
    assert sorted(int(batch.req[r.row]) for r in ring_reads) == [0, 1, 4]
    assert "owns rows 0 to 7 (`ROWS = 8`): four group rows, one of them (row 0, pos 5) with its partner in the ring" in text
    first_block = [r for r in plan.rows[:8] if r.completes_group]
    assert len(first_block) == 4 and [r.row for r in first_block if r.partner is c2.Partner.RING] == [0]
    assert int(batch.pos[0]) == 5


def test_the_stored_launch_count_is_read_not_written_in_prose(nb):
    text = prose(nb)
    out = output_of(nb, "results.newest_results()")
    if "eager call" in out:
        count = int(re.search(r"torch\s+eager call, (\d+) CUDA kernel", out).group(1))
        assert f"{count} " not in re.sub(r"\d+ rows", "", text.split("## 8.")[1]), count
    assert "measured in section 7" not in text and "allocations)" not in text


def test_the_assembly_checks_run_every_edge_case_the_prose_lists(nb):
    text = prose(nb)
    for case in ("one live row, fewer than the ring", "a zero-length request", "every request slot full",
                 "the last request ending at the bucket's end"):
        assert case in text, case
    out = output_of(nb, "check_compressor(my_compressor)")
    assert out.count("pass: ") == len(puzzles(0)) and "a zero-length request" in out and "(no padding)" in out
