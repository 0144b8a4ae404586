"""CUDA-graph capture for tests and probes: a call captured once (:func:`capture`), and a training
step captured once and replayed on new inputs (:func:`replay_in_cuda_graph`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def capture(fn: Callable[[], object], warmups: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` run ``warmups`` times on a side stream (compiles, caches, plans), then captured
    once: ``(graph, what the captured call returned)``, whose tensors hold each replay's results."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def replay_in_cuda_graph(
    step: Callable[[], torch.Tensor], leaves: Sequence[torch.Tensor], edit: Callable[[], None] | None = None
) -> torch.Tensor:
    """Run ``step`` (a forward and backward that resets the leaves' ``.grad`` first and returns
    the output) twice on a side stream (warm-up: compiles, caches, plans), capture one call in a
    CUDA graph, refill ``leaves`` in place with fresh random values, run ``edit`` (other
    in-place changes, such as new offsets) and replay the graph twice.
    Returns the captured output tensor, which (with the leaves' ``.grad``) now holds the
    replay's results, to compare with eager calls on the new inputs."""
    graph, out = capture(step)
    with torch.no_grad():
        for x in leaves:
            x.copy_(torch.randn_like(x))
        if edit is not None:
            edit()
    for _ in range(2):  # twice: nothing the first replay leaves behind (a tile counter) may matter
        graph.replay()
    torch.cuda.synchronize()
    return out
