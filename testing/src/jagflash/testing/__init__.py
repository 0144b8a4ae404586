"""jagflash test infrastructure: references, inputs, the tolerance rule, hypothesis strategies
and a pytest plugin (markers ``gpu``, ``sm90``, ``interpret``; NaN-poisoned outputs)."""

from jagflash.testing.check import check_against_reference
from jagflash.testing.graphs import replay_in_cuda_graph
from jagflash.testing.inputs import JaggedCase, make_dense, make_jagged
from jagflash.testing.reference import (
    broadcast_q_reference,
    dense_reference,
    jagged_reference,
    reference_grads,
)
from jagflash.testing.tolerance import assert_close, assert_close_all

__all__ = [
    "JaggedCase",
    "assert_close",
    "assert_close_all",
    "broadcast_q_reference",
    "check_against_reference",
    "dense_reference",
    "jagged_reference",
    "make_dense",
    "make_jagged",
    "reference_grads",
    "replay_in_cuda_graph",
]
