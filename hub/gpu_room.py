"""A room on one GPU, without the hub (`make gpu-room` on a CUDA host): for each count of students
asked for, that many students run the same notebooks at once, each in their own kernel and their
own copy of the notebooks' folder, on one card (compiled Triton kernels, real CUDA graphs). Every
notebook must finish with no error. Measures each student's time per notebook and, where
`nvidia-smi` is there, the card's memory and utilisation over the run; writes them as JSON.

    python hub/gpu_room.py --students 1,4,8 --notebooks 03_cuda_graphs_and_broken_offsets.ipynb \
        04_static_offsets.ipynb --out gpu-out/gpu-room.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 300


def one_student(folder: Path, notebooks: list[str]) -> dict:
    """Run ``notebooks`` in order in ``folder`` (a copy of the notebooks' folder), one kernel each."""
    import nbformat
    from nbclient import NotebookClient

    times, errors = {}, []
    for name in notebooks:
        nb = nbformat.read(folder / name, as_version=4)
        started = time.monotonic()
        try:
            NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                           resources={"metadata": {"path": str(folder)}}).execute()
        except Exception as e:  # the first failing cell, said in one line
            errors.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
        times[name] = round(time.monotonic() - started, 1)
    return {"seconds": times, "errors": errors}


class CardWatch(threading.Thread):
    """Polls ``nvidia-smi`` for the card's used memory (MiB) and utilisation (%) until stopped."""

    def __init__(self, device: str):
        super().__init__(daemon=True)
        self.device, self.samples, self.done = device, [], threading.Event()
        self.available = shutil.which("nvidia-smi") is not None

    def run(self):
        while self.available and not self.done.is_set():
            out = subprocess.run(["nvidia-smi", "-i", self.device, "--query-gpu=memory.used,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip():
                used, busy = (float(x) for x in out.stdout.split(","))
                self.samples.append((used, busy))
            self.done.wait(0.5)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        used, busy = zip(*self.samples)
        return {"memory_used_mib_max": max(used), "utilization_pct_mean": round(statistics.mean(busy), 1)}


def room(students: int, notebooks: list[str], device: str) -> dict:
    """``students`` students at once, each a process running :func:`one_student` on its own copy."""
    base = Path(tempfile.mkdtemp(prefix="c2graph-gpu-room-"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
    procs = []
    for k in range(students):
        folder = base / f"student{k + 1:02d}"
        shutil.copytree(REPOSITORY / "notebooks", folder)
        procs.append(subprocess.Popen([sys.executable, __file__, "--one", str(folder), *notebooks], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    watch = CardWatch(device)
    watch.start()
    started = time.monotonic()
    results = []
    for k, proc in enumerate(procs):
        out, err = proc.communicate()
        try:
            results.append(json.loads(out.strip().splitlines()[-1]))
        except (json.JSONDecodeError, IndexError):
            results.append({"seconds": {}, "errors": [f"student {k + 1}: no result (exit {proc.returncode}): "
                                                      f"{err.strip().splitlines()[-1] if err.strip() else ''}"]})
    wall = time.monotonic() - started
    watch.done.set()
    watch.join()
    shutil.rmtree(base, ignore_errors=True)
    per_notebook = {}
    for name in notebooks:
        seconds = sorted(r["seconds"][name] for r in results if name in r["seconds"])
        per_notebook[name] = {"min": seconds[0], "median": statistics.median(seconds), "max": seconds[-1]} if seconds else None
    return {"students": students, "wall_s": round(wall, 1), "per_notebook_s": per_notebook, "card": watch.summary(),
            "errors": [e for r in results for e in r["errors"]]}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one_student(Path(sys.argv[2]), sys.argv[3:])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", default="1,4,8", help="counts of students, e.g. 1,4,8")
    parser.add_argument("--notebooks", nargs="+",
                        default=["03_cuda_graphs_and_broken_offsets.ipynb", "04_static_offsets.ipynb"])
    parser.add_argument("--device", default="0", help="the one CUDA device every student shares")
    parser.add_argument("--out", type=Path, default=Path("gpu-out/gpu-room.json"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu-room: no CUDA device here: run it on a GPU host (`make gpu-room`)", file=sys.stderr)
        return 1
    info = {"device": torch.cuda.get_device_name(int(args.device)), "torch": torch.__version__,
            "cores": os.cpu_count(), "notebooks": args.notebooks, "rooms": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for students in (int(n) for n in args.students.split(",")):
        result = room(students, args.notebooks, args.device)
        info["rooms"].append(result)
        args.out.write_text(json.dumps(info, indent=1))  # kept after each room, in case a later one is cut off
        print(f"{students} students at once on {info['device']}: {result['wall_s']} s in all; per notebook "
              + "; ".join(f"{n} {t['min']}-{t['max']} s" for n, t in result["per_notebook_s"].items() if t)
              + (f"; card memory up to {result['card']['memory_used_mib_max']:.0f} MiB, "
                 f"busy {result['card']['utilization_pct_mean']}%" if result["card"] else "")
              + (f"; {len(result['errors'])} errors: {result['errors'][:3]}" if result["errors"] else ""), flush=True)
    return 1 if any(r["errors"] for r in info["rooms"]) else 0


if __name__ == "__main__":
    sys.exit(main())
