"""The portable (stock Triton) kernels' parts: ``mainloop`` (the fwd, dQ and dK/dV tile programs
and the sequence records) and ``persistent`` (a Plan's walk and the persistent launches).

Re-exported here: the names core modules import from ``jagflash.core.portable``."""

from jagflash.core.portable.mainloop import atomic_add_rows, attn_fwd_tile
from jagflash.core.portable.persistent import sched_first, sched_next

__all__ = ["atomic_add_rows", "attn_fwd_tile", "sched_first", "sched_next"]
