"""The Plan: a load-balancing schedule of one batch's tiles, built once, used by every layer.

Skewed lengths are where jagged attention loses: one 4,096-token sequence among a hundred short
ones gives a few tiles that each cost 64 times more than the rest, and a grid that hands tiles
out in batch order ends with most SMs idle while a few finish the long ones. The kernels
therefore run *persistent*: a fixed number of workers loop over a table of tiles that this
package builds, once per batch, on the device. Build it with
:func:`jagflash.core.plan.build.make_plan` (or a variant's ``make_plan(q, k, ...)``, which fills
in its tile sizes) and pass ``plan=`` to every layer's call: the forward and the backward use
it, and the backward never rebuilds it.

The parts, each imported from its own module (this package re-exports nothing: reading a
Plan's ints needs neither the build's Triton kernels nor its custom op):

- :mod:`~jagflash.core.plan.model`: the schedule kinds, :class:`Plan`, :class:`PlanInfo`, the
  per-pass sections and :func:`plan_info` (a plan's layout from ints alone).
- :mod:`~jagflash.core.plan.cost`: the tile cost model and one pass's section, in torch.
- :mod:`~jagflash.core.plan.build`: :func:`make_plan` and the ``jagflash::build_plan`` op
  (Triton kernels on a GPU, torch ops elsewhere; identical tables).
- :mod:`~jagflash.core.plan.check`: refusing a plan built for another problem
  (:func:`check_plan`), and what an op does with its ``plan_*`` arguments (:func:`resolve_plan`).
- :mod:`~jagflash.core.plan.simulate`: a schedule replayed on the CPU (makespan, efficiency,
  sequences in flight).

How a kernel's programs take a plan's tiles (deal flags, worker count, the launch) is the host
side of :mod:`jagflash.core.tile_scheduler`.
"""
