"""CUDA-graph capture for tests: a training step captured once and replayed on new inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def replay_in_cuda_graph(
    step: Callable[[], torch.Tensor], leaves: Sequence[torch.Tensor], edit: Callable[[], None] | None = None
) -> torch.Tensor:
    """Run ``step`` (a forward and backward that resets the leaves' ``.grad`` first and returns
    the output) twice on a side stream (warm-up: compiles, caches, plans), capture one call in a
    CUDA graph, refill ``leaves`` in place with fresh random values, run ``edit`` (other
    in-place changes, such as new offsets) and replay the graph twice.
    Returns the captured output tensor, which (with the leaves' ``.grad``) now holds the
    replay's results, to compare with eager calls on the new inputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    with torch.no_grad():
        for x in leaves:
            x.copy_(torch.randn_like(x))
        if edit is not None:
            edit()
    for _ in range(2):  # twice: nothing the first replay leaves behind (a tile counter) may matter
        graph.replay()
    torch.cuda.synchronize()
    return out
