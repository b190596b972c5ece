"""The paged ``req_to_token`` table: where each token of each pool request lives in the full KV pool.

Token ``pos`` of pool request ``req`` is at ``raw_out_loc = page * page_size + pos % page_size``.
Page 0 is reserved: ``raw_out_loc == 0`` never belongs to a real token, so it marks padding.
``page_size`` is even, so a group's two tokens share a page and one c2 slot ``raw_out_loc // 2``.
"""

from __future__ import annotations

import torch

from .config import Config


class ReqToTokenPool:
    """A ``req_to_token`` table with pages handed out on first use, in a shuffled order.

    ``pool_requests`` requests of up to ``max_seq_len`` tokens each. Pages are shuffled
    (seeded) so that consecutive pages of a request are not neighbours in memory, as in a
    serving engine after a while. ``kv_slots`` is the number of c2 slots the pool covers.
    """

    def __init__(self, cfg: Config, pool_requests: int, max_seq_len: int, seed: int = 0):
        if not isinstance(pool_requests, int) or pool_requests <= 0:
            raise ValueError(f"pool_requests = {pool_requests!r}; expected a positive int")
        if not isinstance(max_seq_len, int) or max_seq_len <= 0:
            raise ValueError(f"max_seq_len = {max_seq_len!r}; expected a positive int")
        self.cfg = cfg
        self.pool_requests = pool_requests
        self.pages_per_request = -(-max_seq_len // cfg.page_size)
        self.max_seq_len = self.pages_per_request * cfg.page_size
        self.num_pages = 1 + pool_requests * self.pages_per_request  # page 0 is reserved
        g = torch.Generator().manual_seed(seed)
        self._free = (1 + torch.randperm(self.num_pages - 1, generator=g)).tolist()
        # page_table[req, k] is the page of the request's k-th page of tokens; 0 = none yet
        self.page_table = torch.zeros(pool_requests, self.pages_per_request, dtype=torch.int64)

    @property
    def kv_slots(self) -> int:
        """Number of c2 slots in the pool (two tokens per slot), reserved page included."""
        return self.num_pages * self.cfg.page_size // 2

    def check_request(self, pool_index: int, prefix_len: int, extend_len: int, where: str = "") -> None:
        """Raise ``ValueError`` unless the tokens ``[prefix_len, prefix_len + extend_len)`` fit."""
        for name, value in (("pool_index", pool_index), ("prefix_len", prefix_len), ("extend_len", extend_len)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{where}{name} = {value!r}; expected an int")
        if not 0 <= pool_index < self.pool_requests:
            raise ValueError(
                f"{where}pool_index = {pool_index}; expected 0 <= pool_index < pool_requests "
                f"({self.pool_requests})"
            )
        if prefix_len < 0:
            raise ValueError(f"{where}prefix_len = {prefix_len}; expected >= 0")
        if extend_len < 0:
            raise ValueError(f"{where}extend_len = {extend_len}; expected >= 0")
        if prefix_len + extend_len > self.max_seq_len:
            raise ValueError(
                f"{where}positions up to {prefix_len + extend_len - 1} are past the allocator: "
                f"prefix_len + extend_len = {prefix_len + extend_len} > max_seq_len ({self.max_seq_len})"
            )

    def locations(self, pool_index: int, prefix_len: int, extend_len: int) -> torch.Tensor:
        """``raw_out_loc`` of positions ``prefix_len ...`` of one request: ``[extend_len]`` int64.

        Pages the positions need are allocated on the way; a page once given to a request stays
        its own until :meth:`free`, so asking again for the same positions returns the same
        locations (how a chunked run and a whole run of one request share their slots).
        """
        self.check_request(pool_index, prefix_len, extend_len)
        pos = torch.arange(prefix_len, prefix_len + extend_len, dtype=torch.int64)
        page_idx = pos // self.cfg.page_size
        row = self.page_table[pool_index]
        for k in sorted(set(page_idx.tolist())):
            if row[k] == 0:
                if not self._free:
                    raise ValueError("the full KV pool has no free page left")
                row[k] = self._free.pop()
        return row[page_idx] * self.cfg.page_size + pos % self.cfg.page_size

    def free(self, pool_index: int) -> None:
        """Give a finished request's pages back (the pool slot can then be recycled)."""
        row = self.page_table[pool_index]
        self._free.extend(p for p in row.tolist() if p)
        row.zero_()
