"""Drop-in replacements for the two varlen attention calls jagged models already make.

>>> from jagflash.compat import flash_attn_varlen_func   # instead of flash_attn's
>>> from jagflash.compat import varlen_attn              # instead of torch.nn.attention.varlen's

Same signatures, semantics and return conventions as the originals; each call goes through
:func:`jagflash.core.attention` (the front door) to the best installed variant. What jagflash
does not compute (dropout, ALiBi, softcapping, attention probabilities, paged or split KV) is
refused with :class:`~jagflash.core.capability.UnsupportedProblem` listing every reason, never
ignored.
"""

from jagflash.compat.flash_attn import flash_attn_varlen_func
from jagflash.compat.torch_varlen import varlen_attn

__all__ = ["flash_attn_varlen_func", "varlen_attn"]
