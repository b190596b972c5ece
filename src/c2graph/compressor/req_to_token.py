"""The paged ``req_to_token`` table: where each token of each pool request lives in the full KV pool.

Token ``pos`` of pool request ``req`` is at ``raw_out_loc = page * page_size + pos % page_size``.
Page 0 is reserved: ``raw_out_loc == 0`` never belongs to a real token, so it marks padding.
``page_size`` is even, so a group's two tokens share a page and one c2 slot ``raw_out_loc // 2``.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import torch

from .arguments import as_int, check_fits_memory
from .config import Config


class Pages(NamedTuple):
    """What :meth:`ReqToTokenPool.pages_for` worked out: every row of the requests, in order
    (``rows``: ``(pos, req, raw_out_loc)``, ``[live]`` int64 numpy arrays, on the host), the table and
    free list after giving the pages, the smallest and largest location (``(0, -1)`` for no token),
    the largest at an odd position (-1 for none), and the allocator's state they were worked out
    from (:meth:`ReqToTokenPool.take` refuses them once it changed)."""

    rows: tuple
    table: torch.Tensor
    free: list[int]
    extent: tuple[int, int]
    odd_max: int
    state: object = None


class ReqToTokenPool:
    """A ``req_to_token`` table with pages handed out on first use, in a shuffled order.

    ``pool_requests`` requests of up to ``max_seq_len`` tokens each. Pages are shuffled
    (seeded) so that consecutive pages of a request are not neighbours in memory, as in a
    serving engine after a while. ``kv_slots`` is the number of c2 slots the pool covers.

    Sizes the host cannot hold are refused before anything is allocated. Giving pages
    (:meth:`take`, through :meth:`assign` or :meth:`ExtendBatch.build
    <c2graph.compressor.batch.ExtendBatch.build>`) and taking them back (:meth:`free`) are atomic
    and safe under threads: each works out the new table and free list first and commits them with
    plain assignments, holding :attr:`lock`, so an exception or a ``KeyboardInterrupt`` leaves the
    allocator as it was, and two threads never get one page. Its tensors are normal ones, even when
    it is made under ``torch.inference_mode()``.

    The caller's contract: :meth:`free` forgets a request; the pool index may then serve a new
    request, which must start at position 0 (or at an even one). The package keeps no identity of a
    request beyond its pool index, so it cannot tell a new request that starts at an odd position
    from a continuation of the freed one: such a request would pair its first row with the freed
    request's row parked in the ring.
    """

    def __init__(self, cfg: Config, pool_requests: int, max_seq_len: int, seed: int = 0):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg is a {type(cfg).__name__}; expected a c2graph.Config")
        pool_requests = as_int("pool_requests", pool_requests, least=1)
        pages_per_request = -(-as_int("max_seq_len", max_seq_len, least=1) // cfg.page_size)
        seed = as_int("seed", seed, least=-(2**63), below=2**64, below_is="2**64 (what torch.manual_seed takes)")
        num_pages = 1 + pool_requests * pages_per_request  # page 0 is reserved
        # the table (int64), the shuffle (int64) and the free list (a Python int each, about 36 bytes)
        check_fits_memory(f"pool_requests = {pool_requests} with max_seq_len = {max_seq_len}",
                          8 * (num_pages - 1) + 8 * num_pages + 36 * num_pages, torch.device("cpu"),
                          "the page table and the free list")
        self.cfg, self.pool_requests = cfg, pool_requests
        self.pages_per_request = pages_per_request
        self.max_seq_len = pages_per_request * cfg.page_size
        self.num_pages = num_pages
        self.lock = threading.RLock()
        """Held while pages are worked out and given (:meth:`ExtendBatch.build` holds it from
        :meth:`pages_for` to :meth:`take`) or taken back: one change at a time."""
        with torch.inference_mode(False):  # normal tensors, whatever the caller's mode
            g = torch.Generator().manual_seed(seed)
            self._free = (1 + torch.randperm(num_pages - 1, generator=g)).tolist()
            # page_table[req, k] is the page of the request's k-th page of tokens; 0 = none yet
            self.page_table = torch.zeros(pool_requests, pages_per_request, dtype=torch.int64)
        self._state = object()  # a new one at every change: Pages worked out before it are stale

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["lock"]  # a lock is not copied: the copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.RLock()

    @property
    def kv_slots(self) -> int:
        """Number of c2 slots in the pool (two tokens per slot), reserved page included."""
        return self.num_pages * self.cfg.page_size // 2

    @property
    def free_pages(self) -> int:
        """Pages not yet given to any request."""
        return len(self._free)

    def check_request(self, pool_index, prefix_len, extend_len, where: str = "") -> tuple[int, int, int]:
        """The request as three ints, or ``ValueError`` unless the tokens ``[prefix_len, prefix_len +
        extend_len)`` of pool request ``pool_index`` fit."""
        if (type(pool_index) is int and type(prefix_len) is int and type(extend_len) is int  # the common case
                and 0 <= pool_index < self.pool_requests and prefix_len >= 0 and extend_len >= 0
                and prefix_len + extend_len <= self.max_seq_len):
            return pool_index, prefix_len, extend_len
        pool_index = as_int(f"{where}pool_index", pool_index, least=0, below=self.pool_requests,
                            below_is=f"pool_requests ({self.pool_requests})")
        prefix_len = as_int(f"{where}prefix_len", prefix_len, least=0)
        extend_len = as_int(f"{where}extend_len", extend_len, least=0)
        if prefix_len + extend_len > self.max_seq_len:
            raise ValueError(
                f"{where}positions up to {prefix_len + extend_len - 1} are past the allocator: "
                f"prefix_len + extend_len = {prefix_len + extend_len} > max_seq_len ({self.max_seq_len})"
            )
        return pool_index, prefix_len, extend_len

    def assign(self, requests, *, commit: bool = True) -> list[torch.Tensor]:
        """``raw_out_loc`` of every request ``(pool_index, prefix_len, extend_len)``: one ``[extend_len]``
        int64 tensor each, pages given on the way, all or nothing.

        The pages are worked out on a copy of the table first; when the pool runs out part-way,
        ``ValueError`` and no request keeps a page. ``commit=False`` gives no page at all: the
        locations the requests would get (the batch checks them against the pools that way).
        """
        with self.lock:
            requests = [self.check_request(*_fields(r, i), where=f"request {i}: ") for i, r in enumerate(requests)]
            pages = self.pages_for(requests)
            if commit:
                self.take(pages)
        return list(torch.from_numpy(pages.rows[2]).split([r[2] for r in requests]))

    def pages_for(self, requests) -> "Pages":
        """The pages ``requests`` (checked ones: :meth:`check_request`) would get, worked out on a copy
        of the table: :class:`Pages`, nothing given yet (:meth:`take` gives them, unless the
        allocator changed in between). ``ValueError`` when the pool runs out part-way. Reads only
        this host-side table."""
        with self.lock, torch.inference_mode(False):
            return self._pages_for(requests)

    def _pages_for(self, requests) -> "Pages":
        # Small arrays, worked on with numpy through views of the tensors (a numpy call costs the
        # host a fraction of a torch call's dispatch): a step's pages for 16 requests in some tens of µs.
        ps, per = self.cfg.page_size, self.pages_per_request
        table, free, state = self.page_table.clone(), list(self._free), self._state
        flat = table.view(-1).numpy()  # page k of request i at i * per + k
        # the pages each request's positions cover (a run of page numbers), read in one gather
        wanted = [pool_index * per + k for pool_index, prefix_len, extend_len in requests if extend_len
                  for k in range(prefix_len // ps, (prefix_len + extend_len - 1) // ps + 1)]
        held = flat[wanted].tolist()
        given: dict[int, int] = {}  # flat index -> the page given to it now
        for where, page in zip(wanted, held):  # in request order, each request's pages ascending
            if page == 0 and where not in given:
                if not free:
                    raise ValueError(f"the full KV pool has {len(self._free)} free pages, too few for "
                                     f"these {len(requests)} requests; expected requests that fit "
                                     "(free() finished requests first)")
                given[where] = free.pop()
        flat[list(given)] = list(given.values())
        # every row's position and pool index, then its location: whole-batch operations, no loop over rows
        lens = np.array([n for _, _, n in requests], dtype=np.int64)
        starts = np.cumsum(lens) - lens  # a request's rows start at ``starts``, its positions at ``prefix_len``
        pool_index = np.array([r[0] for r in requests], dtype=np.int64)
        prefix = np.array([r[1] for r in requests], dtype=np.int64)
        live = int(lens.sum())
        req = np.repeat(pool_index, lens)
        pos = np.arange(live, dtype=np.int64) - np.repeat(starts - prefix, lens)
        page = pos // ps
        every = flat[req * per + page] * ps + (pos - page * ps)
        if live:
            odd = every[pos % 2 == 1]
            lo, hi, odd_max = int(every.min()), int(every.max()), int(odd.max()) if odd.size else -1
        else:
            lo, hi, odd_max = 0, -1, -1
        return Pages((pos, req, every), table, free, (lo, hi), odd_max, state)

    def take(self, pages: "Pages") -> None:
        """Give the pages :meth:`pages_for` worked out: ``ValueError``, and nothing given, when the
        allocator changed since (another thread's batch, a :meth:`free`), since they may be given
        already. Atomic: the new table and free list are committed by plain assignment."""
        if not isinstance(pages, Pages):
            raise ValueError(f"pages is a {type(pages).__name__}; expected the Pages that pages_for worked out")
        with self.lock:
            if pages.state is not self._state:
                raise ValueError("pages were worked out before this allocator last changed (pages given or freed "
                                 "since, or by another allocator); expected pages from pages_for since: work them "
                                 "out again")
            table, free, state = pages.table, list(pages.free), object()
            # the commit: plain assignments on one line, no call among them (an interrupt lands before or after)
            self.page_table, self._free, self._state = table, free, state

    def locations(self, pool_index: int, prefix_len: int, extend_len: int) -> torch.Tensor:
        """``raw_out_loc`` of positions ``prefix_len ...`` of one request: ``[extend_len]`` int64.

        Pages the positions need are allocated on the way; a page once given to a request stays
        its own until :meth:`free`, so asking again for the same positions returns the same
        locations (how a chunked run and a whole run of one request share their slots).
        """
        return self.assign([(pool_index, prefix_len, extend_len)])[0]

    def free(self, pool_index: int) -> None:
        """Give a finished request's pages back (the pool slot can then be recycled: a new request
        there starts at position 0, see the class's contract). Atomic, as :meth:`take`."""
        pool_index = as_int("pool_index", pool_index, least=0, below=self.pool_requests,
                            below_is=f"pool_requests ({self.pool_requests})")
        with self.lock, torch.inference_mode(False):
            table = self.page_table.clone()
            row = table[pool_index]
            free = self._free + [p for p in row.tolist() if p]
            row.zero_()
            state = object()
            self.page_table, self._free, self._state = table, free, state  # the commit, as in take


def _fields(request, i: int) -> tuple:
    """A request's fields, or ``ValueError`` naming it unless it has three."""
    try:
        fields = tuple(request)
    except TypeError:
        fields = ()
    if len(fields) != 3:
        raise ValueError(f"request {i} = {request!r}; expected three fields (pool_index, prefix_len, extend_len)")
    return fields
