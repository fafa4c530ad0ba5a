"""The talker's KV cache as a pool of fixed-size blocks of positions, shared by every slot.

A slot holds blocks only for the positions its request reached, taken from the pool as it grows and given back
when it ends, so the pool holds what live requests use rather than every slot's longest possible request. The
device block table maps each slot's i-th block of positions to a block of the pool; the decode kernels (and the
PyTorch path, through a gather) read it. Entries of positions a slot does not hold point at block 0, a block no
slot owns: a row that computes without advancing (a free slot, a paused request) writes there, never into
another slot's blocks. Bookkeeping is on the host; the device table follows at `upload`, which the runner calls
before each decode launch, the only reader.
"""

from __future__ import annotations

import numpy as np
import torch

from chorus.talker.engine.host_mirror import HostMirror

BLOCK_SIZE = 64  # positions per block: one tile of the attention kernel's key loop
SPARE_BLOCK = 0


def blocks_for(num_positions: int) -> int:
    return -(-num_positions // BLOCK_SIZE)


class KVBlocks:
    def __init__(self, num_slots: int, max_positions: int, num_blocks: int, device: torch.device) -> None:
        """`num_blocks` counts the spare block; the pool must hold at least one request of `max_positions`."""
        self.blocks_per_slot = blocks_for(max_positions)
        if num_blocks - 1 < self.blocks_per_slot:
            raise ValueError(
                f"a KV pool of {num_blocks - 1} blocks cannot hold one request of {max_positions} positions"
            )
        self.num_blocks = num_blocks
        self.table = torch.zeros(num_slots, self.blocks_per_slot, dtype=torch.int32, device=device)
        self._mirror = HostMirror(self.table)
        self.host_table = self._mirror.host
        self.held = np.zeros(num_slots, dtype=np.int64)  # blocks each slot holds: its table's first entries
        self._free = list(range(num_blocks - 1, SPARE_BLOCK, -1))  # popped from the end: low blocks first

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_holders(self) -> int:
        """Slots holding any block."""
        return int(np.count_nonzero(self.held))

    def missing(self, slot: int, num_positions: int) -> int:
        """Blocks `slot` still needs to hold positions `[0, num_positions)`."""
        return max(0, blocks_for(num_positions) - int(self.held[slot]))

    def grow(self, slot: int, num_positions: int) -> bool:
        """Give `slot` the blocks for positions `[0, num_positions)`; False (and nothing taken) when the pool has
        too few free."""
        missing = self.missing(slot, num_positions)
        if missing > len(self._free):
            return False
        if missing:
            first = int(self.held[slot])
            self.host_table[slot, first : first + missing] = [self._free.pop() for _ in range(missing)]
            self.held[slot] += missing
            self._mirror.mark_changed()
        return True

    def release(self, slot: int) -> None:
        """Return `slot`'s blocks to the pool and point its table at the spare block."""
        held = int(self.held[slot])
        if held == 0:
            return
        self._free.extend(reversed(self.host_table[slot, :held].tolist()))
        self.host_table[slot, :held] = SPARE_BLOCK
        self.held[slot] = 0
        self._mirror.mark_changed()

    def upload(self) -> None:
        """The device table as the host's, if it changed (enqueued: steps already launched see the old one)."""
        self._mirror.upload()

    def owned(self, slot: int, num_positions: int) -> list[int]:
        """The pool blocks holding `slot`'s positions `[0, num_positions)` (which it must hold)."""
        count = blocks_for(num_positions)
        assert count <= self.held[slot], f"slot {slot} holds {self.held[slot]} blocks, {count} needed"
        return self.host_table[slot, :count].tolist()

    def prompt_targets(self, slots: list[int], lengths: list[int], out: np.ndarray) -> None:
        """Where a prefill's blocks go, into `out [rows ≥ len(slots), blocks]`: row i's j-th block of positions to the
        pool block holding slot i's, for its `lengths[i]` positions; every other entry (past a prompt, or a padded
        row) to the spare block, which nothing reads."""
        out.fill(SPARE_BLOCK)
        for row, (slot, length) in enumerate(zip(slots, lengths, strict=True)):
            owned = self.owned(slot, length)
            out[row, : len(owned)] = owned
