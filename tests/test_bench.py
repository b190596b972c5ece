"""The benchmark, its results schema and the pictures of stored results."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import c2graph as c2  # noqa: I001  (first: on a CPU it sets TRITON_INTERPRET=1 before Triton is imported)
from c2graph.measure import bench, bench_cases, results
from c2graph.measure.compiled import compress_torch_fp32
from c2graph.measure.timing import median_us
from c2graph.measure.traffic import minimum_bytes, weight_bytes
from c2graph.pictures.bench_plots import draw_bandwidth, draw_times, time_lines, write_gpu_figures

from support import make_case

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of the command line (tiny preset, one bucket): its exit code, file and printout."""
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = bench.main(["--smoke", "--rows", "16", "--reps", "2", "--out", str(out)])
    return code, out, printed.getvalue()


# ------------------------------------------------------------------------------------------------
# the smoke run and the schema
# ------------------------------------------------------------------------------------------------


def test_smoke_run_writes_a_file_with_the_schema(smoke):
    code, out, printed = smoke
    data = results.load_results(out)  # raises unless the schema holds
    assert data["smoke"] is True and data["config"] == "tiny" and data["complete"] is True
    assert not out.with_name(out.name + ".part").exists()
    measured = {(r["path"], r["mode"], r["variant"]) for r in data["records"]}
    assert measured >= {("torch", "eager", "float64 reductions"), ("torch", "graph", "float64 reductions"),
                        ("fused", "eager", "Triton kernel"), ("fused", "graph", "Triton kernel"),
                        ("compiled", "graph", "float64 reductions"), ("compiled", "graph", "fp32 reductions")}
    by = {(r["path"], r["mode"]): r for r in data["records"]}
    assert by[("fused", "eager")]["launches"] == 1 and by[("fused", "graph")]["nodes"] == 1
    assert by[("torch", "eager")]["launches"] > 100  # the dispatcher's ops on a CPU
    assert all(r["bw_fraction"] > 0 for r in data["records"] if r["path"] == "fused")
    assert_fractions_from_bytes(data)
    assert [c["copies"] for c in data["cases"]] == [2]  # inputs rotated
    # Nothing is left out silently: every path measured, or written down with its reason.
    missing = {(s["path"], s["variant"]) for s in data["skipped"]}
    assert all(s["reason"] for s in data["skipped"])
    assert {p for p, *_ in measured} | {p for p, _ in missing} == set(bench.PATHS)
    assert code == (1 if any(s["reason"].startswith("failed") for s in data["skipped"]) else 0)
    assert "CPU smoke run: not a GPU measurement" in printed and f"wrote {out}" in printed


def test_smoke_needs_a_file_and_a_gpu_run_needs_a_gpu(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--smoke"])
    assert "--out" in capsys.readouterr().err
    if not c2.HAS_CUDA:
        assert bench.main([]) == 2
        assert "has none" in capsys.readouterr().err


def test_run_bench_refuses_bad_arguments():
    with pytest.raises(ValueError, match="reps = 3"):
        bench.run_bench(reps=3)
    with pytest.raises(ValueError, match="paths"):
        bench.run_bench(paths=("torch", "tensorrt"), smoke=True)
    with pytest.raises(ValueError, match="rows"):
        bench.run_bench(rows=(1,), smoke=True)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.pop("copy_GBps"), "results.copy_GBps is missing"),
        (lambda d: d.update(schema="other/1"), "results.schema"),
        (lambda d: d["records"][0].update(path="cuda"), r"results.records\[0\].path = 'cuda'"),
        (lambda d: d["records"][0].update(mode="replay"), r"results.records\[0\].mode"),
        (lambda d: d["records"][0].update(median_us=-1.0), r"results.records\[0\].median_us = -1.0"),
        (lambda d: d["records"][0].update(median_us=float("nan")), r"results.records\[0\].median_us"),
        (lambda d: d["records"][0].update(rows=7), r"results.records\[0\].rows = 7"),
        (lambda d: d["records"][0].update(bw_fraction=0.5), r"results.records\[0\].bw_fraction = 0.5"),
        (lambda d: d["records"][0].update(bw_fraction_weights_per_program=1.0),
         r"results.records\[0\].bw_fraction_weights_per_program = 1.0; expected null"),
        (lambda d: d["cases"][0].pop("bytes_weights_per_program"),
         r"results.cases\[0\].bytes_weights_per_program is missing"),
        (lambda d: d.update(smoke="yes"), "results.smoke = 'yes'"),
        (lambda d: d["launch_us"].pop("graph"), "results.launch_us.graph"),
    ],
)
def test_check_results_names_the_field(smoke, change, field):
    data = json.loads(smoke[1].read_text())
    results.check_results(copy.deepcopy(data))
    assert data["records"][0]["path"] == "torch"  # the record the changes below edit
    change(data)
    with pytest.raises(ValueError, match=field):
        results.check_results(data)


def test_eager_records_count_launches_and_graph_records_count_nodes(smoke):
    data = json.loads(smoke[1].read_text())
    eager = next(i for i, r in enumerate(data["records"]) if r["mode"] == "eager")
    graph = next(i for i, r in enumerate(data["records"]) if r["mode"] == "graph")
    for i, field in ((eager, "nodes"), (graph, "launches")):
        bad = copy.deepcopy(data)
        bad["records"][i][field] = 3
        with pytest.raises(ValueError, match=rf"records\[{i}\].{field} = 3; expected null"):
            results.check_results(bad)
    fused = next(i for i, r in enumerate(data["records"]) if r["path"] == "fused")
    for field in results.FRACTIONS:
        bad = copy.deepcopy(data)
        bad["records"][fused][field] = None
        with pytest.raises(ValueError, match=rf"{field} = None; expected a number > 0 for the fused path"):
            results.check_results(bad)


def test_newest_results_passes_over_smoke_runs(smoke, tmp_path):
    data = json.loads(smoke[1].read_text())
    assert results.newest_results(tmp_path) is None
    (tmp_path / "smoke.json").write_text(json.dumps(data))
    assert results.newest_results(tmp_path) is None
    for date in ("2026-01-02", "2026-03-04"):
        (tmp_path / f"{date}-gpu.json").write_text(json.dumps(dict(data, smoke=False, date=date)))
    assert results.newest_results(tmp_path).name == "2026-03-04-gpu.json"


def assert_fractions_from_bytes(data: dict) -> None:
    """Every fused record's two shares of the copy bandwidth are its case's bytes over its time:
    ``bw_fraction`` from the step's bytes (weights once), the other with the weights once a program."""
    cases = {c["rows"]: c for c in data["cases"]}
    for r in data["records"]:
        if r["path"] != "fused":
            continue
        per_us = r["median_us"] * 1e3 * data["copy_GBps"]
        case = cases[r["rows"]]
        assert r["bw_fraction"] == pytest.approx(case["floor_bytes"] / per_us, rel=1e-12), r
        assert r["bw_fraction_weights_per_program"] == pytest.approx(case["bytes_weights_per_program"] / per_us,
                                                                     rel=1e-12), r
        assert r["bw_fraction"] < r["bw_fraction_weights_per_program"]


STORED = sorted((ROOT / results.RESULTS_FOLDER).glob("*.json"))


@pytest.mark.parametrize("path", STORED, ids=[p.name for p in STORED])  # none stored: pytest says so
def test_stored_results_are_gpu_runs_with_the_schema(path):
    data = results.load_results(path)
    assert not data["smoke"], f"{path.name} is a smoke run: it measured nothing, never store it"
    assert data["complete"], f"{path.name} is the file of a run that was stopped before its end"
    assert data["timer"] == "CUDA events" and data["config"] == "dsv41"
    assert path == bench.default_file(data["device"], data["date"], path.parent)
    assert_fractions_from_bytes(data)
    floors = results.computed_floor_us(data)
    for n, r in results.records(data, "fused", "graph").items():  # the headline share is the floor ratio
        assert r["bw_fraction"] == pytest.approx(floors[n] / r["median_us"], rel=1e-12)


def test_results_table_quotes_the_faster_compiled_variant(smoke):
    data = json.loads(smoke[1].read_text())
    table = results.results_table(data)
    fastest = results.fastest_compiled(data)[16]
    assert fastest["median_us"] == min(r["median_us"] for r in data["records"] if r["path"] == "compiled")
    assert f"the faster variant is {fastest['variant']}" in table
    assert table.splitlines()[1].split("|")[0].strip() == "16"


# ------------------------------------------------------------------------------------------------
# the pieces: batches, bytes, timers, the compiled variant
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [16, 256, 2048, 65536])
def test_bench_requests(rows):
    requests = bench_cases.bench_requests(rows, seed=rows)
    assert bench_cases.REQUESTS[0] <= len(requests) <= bench_cases.REQUESTS[1]
    assert sum(n for *_, n in requests) == rows - rows // 16
    assert all(n > 0 for *_, n in requests)
    parities = {prefix % 2 for _, prefix, _ in requests}
    assert parities == {0, 1}
    assert sorted(p for p, *_ in requests) == list(range(len(requests)))
    assert requests == bench_cases.bench_requests(rows, seed=rows)  # seeded
    with pytest.raises(ValueError, match="rows = 1"):
        bench_cases.bench_requests(1, seed=0)


def test_minimum_bytes_counts_weights_once_per_program():
    cfg = c2.Config.dsv41()
    assert weight_bytes(cfg) == 512 * 2 + 128 * 512 * 2 + 128 * 2 + 32 * 4
    layer, alloc, pools = make_case(c2.Config.tiny(), device="cpu")
    batch = c2.ExtendBatch.build([(0, 3, 6), (2, 0, 5)], alloc, request_slots=3, pad_to=12, device="cpu")
    one, five = minimum_bytes(layer.cfg, batch), minimum_bytes(layer.cfg, batch, programs=5)
    assert five["read weights"] == 5 * one["read weights"] == 5 * weight_bytes(layer.cfg)
    assert {k: v for k, v in five.items() if k != "read weights"} == {k: v for k, v in one.items() if k != "read weights"}
    with pytest.raises(ValueError, match="programs = 0"):
        minimum_bytes(layer.cfg, batch, programs=0)


def test_case_counts_the_kernels_programs_and_rotates_inputs():
    cfg = c2.Config.tiny()
    case = bench_cases.make_case(cfg, 48, torch.device("cpu"), cache_bytes=10**6, copies=(1, 8))
    plan = c2.program_plan(case.batch, cfg.ring_size, D=cfg.D)
    # Blocks of 8 pairs of rows; the programs that read the weights are those with groups. The grid
    # has blocks for the most pairs 48 rows and 16 request slots can hold (32), and for one past them.
    pairs = sum((n + 1) // 2 for *_, n in case.requests)
    assert case.programs == sum(bool(p["groups"]) for p in plan) == -(-pairs // 8) == 4
    assert len(plan) == 5
    per_program = sum(minimum_bytes(cfg, case.batch, programs=case.programs).values())
    assert case.floor_bytes == sum(minimum_bytes(cfg, case.batch).values()) < case.bytes_weights_per_program == per_program
    assert case.copies == 8  # 2 MB of inputs wanted, a few KB each: capped
    sets = bench_cases.input_sets(cfg, case, 2)
    assert sets[0].pools.kv_cache.data_ptr() != sets[1].pools.kv_cache.data_ptr()
    assert not torch.equal(sets[0].projected, sets[1].projected)
    live = case.batch.live_rows
    assert bool((sets[0].projected[live:] == 0).all()) and torch.equal(sets[0].kv, sets[0].projected[:, : cfg.D])


def test_median_us_takes_the_calls_in_turn():
    seen = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    assert median_us(calls, reps=7, device=torch.device("cpu"), warmup=1) > 0
    assert seen == [0, 1, 2] + [i % 3 for i in range(7)]
    with pytest.raises(ValueError, match="reps = 0"):
        median_us(calls, reps=0, device=torch.device("cpu"))


def test_median_us_host_ahead_takes_the_calls_in_turn_on_a_cpu_too():
    seen = []
    calls = [lambda i=i: seen.append(i) for i in range(2)]
    assert median_us(calls, reps=5, device=torch.device("cpu"), warmup=1, host_ahead=True) > 0
    assert seen == [0, 1] + [i % 2 for i in range(5)]


# Not a hidden failure: the CPU path of host_ahead is the test above; this one needs a GPU to sleep.
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sleep kernel that holds the GPU needs CUDA")
def test_median_us_host_ahead_runs_every_call_behind_the_sleep():
    from c2graph.measure.timing import gpu_cycles_per_us

    assert gpu_cycles_per_us(torch.device("cuda")) > 100  # an H200 runs at 1-2 GHz
    x = torch.zeros(3, device="cuda")
    calls = [lambda i=i: x[i].add_(1.0) for i in range(3)]
    assert median_us(calls, reps=9, device=torch.device("cuda"), warmup=1, host_ahead=True) > 0
    assert x.tolist() == [4.0, 4.0, 4.0]  # one warm-up and three timed calls each


def test_fp32_torch_path_agrees_with_the_torch_path():
    layer, alloc, pools = make_case(use_fused_gate=False)
    first = c2.ExtendBatch.build([(0, 0, 5), (3, 0, 4)], alloc, request_slots=4)
    c2.compress(layer, layer.random_hidden(9, seed=1), first, pools)  # the ring holds pending rows
    batch = c2.ExtendBatch.build([(0, 5, 7), (3, 4, 6), (1, 1, 5)], alloc, request_slots=4, pad_to=20)
    kv, score = c2.project_padded(layer, layer.random_hidden(18, seed=2), batch, fused=False)
    latent = torch.full((20, layer.cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    s = bench_cases.InputSet(batch, pools, torch.cat([kv, score], dim=1), kv, score, latent)
    assert bench.disagreement(compress_torch_fp32, layer, s) is None
    assert bench.disagreement(c2.compress_torch, layer, s) is None

    def wrong(layer, kv, score, batch, pools, *, latent_out):
        return compress_torch_fp32(layer, kv * 1.5, score, batch, pools, latent_out=latent_out)

    assert "latent differs" in bench.disagreement(wrong, layer, s)


def test_compare_within_the_rows_scale_not_each_values():
    """A value may move by up to 2**-6 of its row's largest value (RoPE turns pairs of dims, so a
    latent rounded the other way moves a small output as much as a large one); more is wrong."""
    want = torch.tensor([[4.0, 0.01, float("nan")], [0.5, -0.25, 0.125]])
    got = want.clone()
    got[0, 1] += 0.05  # more than 2**-6 of 0.01, less than 2**-6 * (1 + 4)
    assert bench.close_in_row(got, want).all()
    got[1, 2] += 0.05  # more than 2**-6 * (1 + 0.5)
    assert bench.close_in_row(got, want).tolist() == [[True, True, True], [True, True, False]]
    got[0, 2] = 1.0  # a value where NaN was expected
    assert not bench.close_in_row(got, want)[0, 2]


def test_disagreement_catches_one_wrong_cached_value():
    layer, alloc, pools = make_case(use_fused_gate=False)
    batch = c2.ExtendBatch.build([(0, 3, 7), (2, 0, 6)], alloc, request_slots=3, pad_to=16)
    kv, score = c2.project_padded(layer, layer.random_hidden(13, seed=5), batch, fused=False)
    latent = torch.full((16, layer.cfg.D), float("nan"), dtype=torch.bfloat16, device=pools.device)
    s = bench_cases.InputSet(batch, pools, torch.cat([kv, score], dim=1), kv, score, latent)
    slot = batch.c2_slot[batch.c2_slot != 0][0].item()

    def one_wrong(layer, kv, score, batch, pools, *, latent_out):  # the torch path, one cached value moved
        c2.compress_torch(layer, kv, score, batch, pools, latent_out=latent_out)
        pools.kv_cache[slot, 3] += 2.0**-4 * (1 + pools.kv_cache[slot].float().abs().max())

    assert "kv_cache differs from the torch path's in 1 values" in bench.disagreement(one_wrong, layer, s)


def test_compiled_specialises_each_row_count():
    """Each row count gets its own compilation with static sizes, as each bucket's graph would:
    left to its default, torch.compile would reuse one with symbolic sizes from the second on."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from c2graph.measure.compiled import compiled

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    fn = compiled("fp32 reductions", backend=counter)
    cfg, layer = c2.Config.tiny(), None
    for rows in (16, 48, 32):
        case = bench_cases.make_case(cfg, rows, torch.device("cpu"), cache_bytes=0, copies=(1, 1))
        s = bench_cases.input_sets(cfg, case, 1)[0]
        layer = layer or c2.SourceLayer(cfg, seed=0, use_fused_gate=False, device="cpu")
        fn(layer, s.kv, s.score, bench_cases.graph_view(s.batch), s.pools, latent_out=s.latent)
    assert counter.frame_count == 3
    for gm in counter.graphs:
        shapes = [n.meta["example_value"].shape for n in gm.graph.nodes
                  if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)]
        assert shapes and all(isinstance(d, int) for shape in shapes for d in shape)


# ------------------------------------------------------------------------------------------------
# pictures of stored results
# ------------------------------------------------------------------------------------------------


def test_write_gpu_figures_titles_every_picture(smoke, tmp_path):
    data = results.load_results(smoke[1])
    paths = write_gpu_figures(smoke[1], tmp_path / "figures")
    assert [p.name for p in paths] == ["bench_times.png", "bench_bandwidth.png", "bench_speedups.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    fig = draw_times(data)
    title = fig._suptitle.get_text()
    for part in (data["device"], data["torch"], data["triton"], data["date"], "not a GPU measurement"):
        assert part in title
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("computed floor") for label in labels)
    assert any(label.startswith("launch floor") and "measured" in label for label in labels)
    drawn = {label for label, *_ in time_lines(data)}
    assert drawn <= set(labels) and "fused kernel, graph" in drawn


def test_pictures_draw_the_stored_values(smoke):
    """Each line of the time picture is the records' medians; each bar of the bandwidth picture a
    record's share of the copy bandwidth, the solid graph bars the headline (weights once)."""
    data = results.load_results(smoke[1])
    fig = draw_times(data)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    for label, path, mode, times in time_lines(data):
        assert list(lines[label].get_ydata()) == list(times.values())
    floor = next(line for name, line in lines.items() if name.startswith("computed floor"))
    assert list(floor.get_ydata()) == list(results.computed_floor_us(data).values())
    fig = draw_bandwidth(data)
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in fig.axes[0].containers}
    graph = results.records(data, "fused", "graph")
    solid = next(v for k, v in bars.items() if k.startswith("fused, graph, weights once ="))
    hatched = next(v for k, v in bars.items() if "a program" in k)
    assert solid == [r["bw_fraction"] for r in graph.values()]
    assert hatched == [r["bw_fraction_weights_per_program"] for r in graph.values()]


# ------------------------------------------------------------------------------------------------
# the host-cost table
# ------------------------------------------------------------------------------------------------

HOST_COST_CALLS = ("compress_fused, validate=False", "compress_fused, validate=True",
                   "the fused kernel launched directly", "ExtendBatch.build (pages and checks)")
BUILT_BEFORE = "  of which refresh + replay, the batch built before"


def assert_host_cost(data: dict, layers: int) -> None:
    """The host-cost file's fields: every call measured once, host times positive, a step's total
    (until the GPU is done) no shorter than its host time. A file of the schema's first version
    (stored before the step on a batch built beforehand was timed) has no such rows."""
    from c2graph.measure import bench_host

    assert data["schema"] in (bench_host.SCHEMA, "c2graph-host-cost/1")
    whats = [r["what"] for r in data["records"]]
    built_before = (BUILT_BEFORE,) if data["schema"] == bench_host.SCHEMA else ()  # version 1 had no such row
    steps = [(f"runner.run, {layers} layers, projection={p!r}", *built_before) for p in ("exact", "engine")]
    assert whats == [*HOST_COST_CALLS, *(what for step in steps for what in step)]
    for r in data["records"]:
        assert r["host_us"] > 0
        assert (r["total_us"] is None) == (not r["what"].startswith(("runner.run", BUILT_BEFORE)))
        assert r["total_us"] is None or r["total_us"] >= r["host_us"]
    assert data["build_s_request_slots_4096"] > 0


def test_host_cost_smoke_writes_its_own_file(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert bench.main(["--host-cost", "--smoke", "--reps", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["config"] == "tiny"
    assert_host_cost(data, layers=4)
    printed = capsys.readouterr().out
    assert "runner.run, 4 layers, projection='engine'" in printed and f"wrote {out}" in printed


HOST_STORED = sorted((ROOT / results.RESULTS_FOLDER / "host-cost").glob("*.json"))


@pytest.mark.parametrize("path", HOST_STORED, ids=[p.name for p in HOST_STORED])  # none stored: pytest says so
def test_stored_host_costs_are_gpu_runs(path):
    data = json.loads(path.read_text())
    assert data["smoke"] is False and data["config"] == "dsv41" and data["bucket"] == 2048
    assert path == bench.default_file(data["device"], data["date"], path.parent)
    assert_host_cost(data, layers=18)
