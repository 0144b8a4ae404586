"""The tolerance rule lives in ``jagflash.core.tolerance`` (the demo and the bench use it too)."""

from jagflash.core.tolerance import assert_close, assert_close_all

__all__ = ["assert_close", "assert_close_all"]
