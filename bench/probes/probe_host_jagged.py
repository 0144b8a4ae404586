"""Probe (CPU and H200): where the host time of a small jagged call goes (issue 20), forward
and backward, on a 256-sequence power-law batch (most sequences under 30 tokens, a few near
1,000). probe_host_layers.py does the same for broadcast-Q on the GPU only; this one reuses its
timing (medians of 7 rounds of 50 calls issued back to back) and its kernel recorders.

Each layer of the call is timed alone, from the public function down to the kernel wrapper
(the public call with its own plan, memoized and rebuilt, and with ``plan=``, the eager caller, the custom op through
the dispatcher, the op's body, the variant's kernel module), then the pieces the call is made
of (argument checks, the plan's layout and build, the custom op around the build, the offsets'
value checks, backend selection, the plan check, the launch helper), for the forward under
``no_grad`` and for forward + backward with grad, and a cProfile of the public call by own
time.

``--stub`` (the default on a CPU, where the interpreter's time would swamp everything) replaces
the attention kernels by recorders (``probe_host_layers._Recorder``), so the figures are the
host work alone; the plan's build is not stubbed (torch ops on a CPU, four Triton kernels and a
sort on a GPU). On a GPU every layer is timed with the real kernels, then again stubbed; the
public calls are profiled (``probe_host._measure``: do_bench, host issue rate, CUDA kernels,
cProfile); and a forward and a forward + backward with a prebuilt plan are captured in a CUDA
graph, compared with eager calls (bitwise but for the one-pass dQ) and timed replayed.

CPU: ``TRITON_INTERPRET=1 python bench/probes/probe_host_jagged.py`` (~15 s).
H200: ``PROBE=bench/probes/probe_host_jagged.py PROBE_TIMEOUT_S=400 bash bench/gpu.sh probe``
(a few minutes: the TLX kernels compile on the first call); ``PROBE_ARGS=--causal`` for the
causal batch."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys

import numpy as np
import torch
from probe_host import _measure, host_ms_per_call, sync  # bench/probes/ is on sys.path
from probe_host_layers import _rate, _Recorder


def power_law_lengths(count: int, alpha: float, floor: int, cap: int, seed: int) -> np.ndarray:
    """``count`` lengths of the bench's :class:`jagflash.bench.workloads.PowerLaw` drawn with
    ``seed`` (the ``short-powerlaw-*`` workloads' batch at seed 20 and their parameters)."""
    from jagflash.bench.workloads import PowerLaw

    return PowerLaw(count, alpha, floor, cap).sample(np.random.default_rng(seed))


def _offsets(lengths: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)


def _stubs(backend: str):
    """``(module, kernel names)`` of the attention launches the backend's calls make."""
    from jagflash.core.portable import persistent

    table = [(persistent, ("fwd_kernel", "bwd_kernel"))]
    if backend == "tlx-sm90":
        from jagflash.core.tlx import bwd_preprocess, bwd_sm90, fwd_sm90

        table += [(fwd_sm90, ("_fwd_kernel",)), (bwd_preprocess, ("_vectors_kernel",)), (bwd_sm90, ("_dkdv_kernel",))]
    return table


@contextlib.contextmanager
def stubbed(backend: str, enabled: bool = True):
    """The backend's attention kernels replaced by recorders while inside (nothing launches)."""
    saved = []
    try:
        if enabled:
            for module, names in _stubs(backend):
                for name in names:
                    saved.append((module, name, getattr(module, name)))
                    setattr(module, name, _Recorder())
        yield
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)


def _backend(b: dict) -> str:
    """The backend the batch's calls run on."""
    from jagflash.core.backend import select
    from jagflash.core.ops import make_problem
    from jagflash.variants.jagged import SPEC

    return select(SPEC, make_problem("jagged", b["q"], b["k"], causal=b["causal"]), b["q"].device, None, record=False).name


def _layers(b: dict) -> tuple[dict, dict]:
    """The forward's layers and pieces, and the backward's, as closures over batch ``b``."""
    from jagflash.core import jagged_call
    from jagflash.core.backend import select
    from jagflash.core.checks import check_jagged_call
    from jagflash.core.jagged_call import op_plan
    from jagflash.core.ops import call_plan_layout, make_problem
    from jagflash.core.plan import build
    from jagflash.core.plan.check import resolve_plan
    from jagflash.core.plan.model import PlanInfo
    from jagflash.core.tile_scheduler import launch
    from jagflash.core.tuning import plan_blocks
    from jagflash.variants.jagged import SPEC, jagged_attention, make_plan, op

    q, k, v, qo, ko, causal = b["q"], b["k"], b["v"], b["q_offsets"], b["kv_offsets"], b["causal"]
    mq, mk = b["max_q"], b["max_k"]
    lens = {"max_seqlen_q": mq, "max_seqlen_kv": mk}
    plan = make_plan(q, k, qo, ko, causal=causal, **lens)
    ran = _backend(b)
    scale = q.shape[-1] ** -0.5
    op_args = (q, k, v, qo, ko, mq, mk, causal, scale, False, False, "", *plan.op_args())
    blocks, schedule, bwd_schedule = call_plan_layout(SPEC, "jagged", q, k, causal=causal, backend=None)
    ints = plan.info.to_ints()
    left, right = plan.info.left, plan.info.right
    if ran == "tlx-sm90":
        from jagflash.variants.jagged import kernels_tlx_sm90 as km

        def kernel_fwd():
            return km.forward(q, k, v, qo, ko, mq, left=left, right=right, scale=scale, plan=plan)
    else:
        from jagflash.variants.jagged import kernels_portable as km

        def kernel_fwd():
            return km.forward(q, k, v, qo, ko, plan, left=left, right=right, scale=scale, backend=ran)

    rec = _Recorder()

    def launch_fwd():  # the launch helper alone, its kernel a recorder
        launch(rec, plan, "fwd", (q, k, v), ((0,), (0,), (scale, left, right)))

    memo = getattr(jagged_call, "PLAN_MEMO", None)  # None: a tree from before it (an A/B run)

    def no_memo(fn):  # the call as it was before plans were kept per offsets (session 12)
        return lambda: (memo is not None and memo.clear(), fn())[1]

    fwd = {
        "public, own plan": lambda: jagged_attention(q, k, v, qo, ko, causal=causal, **lens),
        "public, own plan, memo cleared": no_memo(lambda: jagged_attention(q, k, v, qo, ko, causal=causal, **lens)),
        "public, plan=": lambda: jagged_attention(q, k, v, qo, ko, causal=causal, plan=plan, **lens),
        "caller op.call_fwd (eager path)": lambda: op.call_fwd(*op_args),
        "custom op jagged_fwd (dispatcher)": lambda: op.jagged_fwd(*op_args),
        "op body, called directly": lambda: op.jagged_fwd._init_fn(*op_args),
        f"kernels module forward ({ran})": kernel_fwd,
        "  piece: check_jagged_call": lambda: check_jagged_call(
            "jagged_attention", q, k, v, qo, ko, max_seqlen_q=mq, max_seqlen_kv=mk, plan=None
        ),
        "  piece: op_plan (own plan)": lambda: op_plan(
            SPEC, None, q, k, qo, ko, causal=causal, window=(-1, -1), max_seqlen_q=mq, max_seqlen_kv=mk,
            backward=False, backend=None,
        ),
        "  piece: call_plan_layout": lambda: call_plan_layout(SPEC, "jagged", q, k, causal=causal, backend=None),
        "  piece: plan_info ints": lambda: build.plan_info(
            batch=qo.numel() - 1, total_q=q.shape[0], total_kv=k.shape[0], heads_q=q.shape[1],
            heads_kv=k.shape[1], causal=causal, blocks=blocks, max_seqlen_q=mq, max_seqlen_kv=mk,
            schedule=schedule, backward_schedule=bwd_schedule, backward=False,
        ).to_ints(),
        "  piece: build_plan custom op": lambda: build.build_plan(qo, ko, ints),
        "  piece: plan _build direct": lambda: build._build(qo, ko, PlanInfo.from_ints(ints)),
        "  piece: offsets value checks": lambda: jagged_call._lengths(
            "jagged_attention", qo, ko, q.shape[0], k.shape[0], mq, mk
        ),
        "  piece: problem + select": lambda: select(SPEC, make_problem("jagged", q, k, causal=causal), q.device, None),
        "  piece: plan check (resolve_plan)": lambda: resolve_plan(
            "jagged_attention", *plan.op_args(), q_offsets=qo, kv_offsets=ko, check_offsets=True,
            total_q=q.shape[0], total_kv=k.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], left=left,
            right=right, blocks=plan_blocks(ran, q.shape[-1]), passes=("fwd",), max_seqlen_q=mq, max_seqlen_kv=mk,
        ),
        "  piece: tile_scheduler.launch": launch_fwd,
    }

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dout = b["dout"]
    out, lse = op.call_fwd(qg, kg, vg, *op_args[3:])
    out, lse = out.detach(), lse.detach()
    bwd_args = (dout, q, k, v, out, lse, *op_args[3:])
    bwd = {
        "public fwd+bwd, own plan": lambda: torch.autograd.grad(
            jagged_attention(qg, kg, vg, qo, ko, causal=causal, **lens), (qg, kg, vg), dout
        ),
        "public fwd+bwd, own plan, memo cleared": no_memo(lambda: torch.autograd.grad(
            jagged_attention(qg, kg, vg, qo, ko, causal=causal, **lens), (qg, kg, vg), dout
        )),
        "public fwd+bwd, plan=": lambda: torch.autograd.grad(
            jagged_attention(qg, kg, vg, qo, ko, causal=causal, plan=plan, **lens), (qg, kg, vg), dout
        ),
        "bwd op body, called directly": lambda: op.jagged_bwd._init_fn(*bwd_args),
        f"kernels module backward ({ran})": lambda: (
            km.backward(dout, q, k, v, out, lse, qo, ko, plan, left=left, right=right, scale=scale)
            if ran == "tlx-sm90"
            else km.backward(dout, q, k, v, out, lse, qo, ko, plan, left=left, right=right, scale=scale, backend=ran)
        ),
    }
    return fwd, bwd, {"plan": plan, "ran": ran, "leaves": (qg, kg, vg), "lens": lens}


def _table(title: str, layers: dict, *, grad: bool) -> dict[str, float]:
    print(f"\n== {title} (host ms per call, median of 7 rounds of 50 back to back)", flush=True)
    got = {}
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    with ctx:
        for name, fn in layers.items():
            got[name] = _rate(fn)
            print(f"{name:44s} {got[name]:8.4f}", flush=True)
    return got


def _profile(label: str, fn, *, grad: bool, n: int = 50, top: int = 22) -> None:
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    prof = cProfile.Profile()
    with ctx:
        fn()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
    sync()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print(f"\ncProfile of {label}, {n} calls, by own time:")
    for ln in s.getvalue().splitlines():
        if ln.strip() and not ln.lstrip().startswith(("Ordered", "List reduced")):
            print("  " + ln[:170])


def _graphs(b: dict, extra: dict) -> None:
    """A forward (no grad) and a forward + backward with a prebuilt plan captured in a CUDA graph:
    do they capture, do replays equal eager calls bit for bit, and what does a replay cost."""
    from triton.testing import do_bench

    from jagflash.testing.graphs import capture
    from jagflash.variants.jagged import jagged_attention

    q, k, v, qo, ko = b["q"], b["k"], b["v"], b["q_offsets"], b["kv_offsets"]
    kw = {"causal": b["causal"], "plan": extra["plan"], **extra["lens"]}
    leaves = extra["leaves"]

    def fwd():
        with torch.no_grad():
            return (jagged_attention(q, k, v, qo, ko, **kw),)

    def step():
        out = jagged_attention(*leaves, qo, ko, **kw)
        return (out, *torch.autograd.grad(out, leaves, b["dout"]))

    for label, fn in (("fwd", fwd), ("fwd+bwd", step)):
        try:
            graph, captured = capture(fn, warmups=3)
        except Exception as e:  # report why it does not capture, and go on
            print(f"\n== CUDA graph {label}: capture FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        graph.replay()
        sync()
        eager = fn()
        # bitwise but for the one-pass backward's dQ, whose reduce-adds run in a varying order
        diffs = ", ".join(
            f"{name} {'==' if torch.equal(a, e) else f'max|d| {(a.float() - e.float()).abs().max().item():.2e}'}"
            for name, a, e in zip(("out", "dq", "dk", "dv"), captured, eager)
        )
        replay_ms = do_bench(graph.replay, warmup=20, rep=200, return_mode="median")
        eager_ms = do_bench(fn, warmup=20, rep=200, return_mode="median")
        host = host_ms_per_call(graph.replay)
        print(
            f"\n== CUDA graph {label}: captured; replay against eager: {diffs}; replay {replay_ms * 1e3:.1f} us "
            f"(host {host * 1e3:.1f} us/replay issued back to back), eager {eager_ms * 1e3:.1f} us", flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=256, help="sequences (256)")
    parser.add_argument("--alpha", type=float, default=1.1, help="Pareto exponent (1.1)")
    parser.add_argument("--floor", type=int, default=6, help="Pareto scale, tokens (6)")
    parser.add_argument("--cap", type=int, default=1024, help="longest sequence (1024)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--stub", choices=("auto", "yes", "no"), default="auto",
                        help="attention kernels replaced by recorders: auto = yes on a CPU, both on a GPU")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32  # the interpreter computes bf16 wrongly
    if not gpu:
        # one intra-op thread: on a shared 2-core machine torch's parallel fill of a [16, 7745]
        # tensor took 11.6 ms with 2 threads and 6 us with 1 (session 12), noise that no GPU
        # host's call pays
        torch.set_num_threads(1)
    lengths = power_law_lengths(args.count, args.alpha, args.floor, args.cap, seed=20)
    gen = torch.Generator(device=device).manual_seed(20)
    t, h, d = int(lengths.sum()), args.heads, args.head_dim

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    qo = _offsets(lengths, device)
    b = {
        "q": randn(t, h, d), "k": randn(t, h, d), "v": randn(t, h, d), "dout": randn(t, h, d),
        "q_offsets": qo, "kv_offsets": qo, "causal": args.causal,
        "max_q": int(lengths.max()), "max_k": int(lengths.max()),
    }
    flops = 4 * h * d * int((lengths.astype(np.int64) ** 2).sum()) * (0.5 if args.causal else 1)
    print(
        f"batch: {args.count} sequences, Pareto alpha {args.alpha} floor {args.floor} cap {args.cap}: "
        f"T {t}, median {int(np.median(lengths))}, p90 {int(np.percentile(lengths, 90))}, max {lengths.max()}, "
        f"{(lengths < 30).mean():.0%} under 30; H {h} D {d} {dtype} causal {args.causal}; "
        f"~{flops / 1e9:.2f} GFLOP forward; device {torch.cuda.get_device_name() if gpu else 'cpu'}", flush=True,
    )
    modes = {"auto": ([False, True] if gpu else [True]), "yes": [True], "no": [False]}[args.stub]
    for stub in modes:
        tag = "kernels stubbed" if stub else "real kernels"
        with stubbed(_backend(b), stub):
            fwd, bwd, extra = _layers(b)
            _table(f"forward, no grad, {tag}", fwd, grad=False)
            _table(f"backward, {tag}", bwd, grad=True)
            _profile(f"the public forward, own plan, {tag}", fwd["public, own plan"], grad=False)
            _profile(f"the public forward + backward, plan=, {tag}", bwd["public fwd+bwd, plan="], grad=True)
        if gpu and not stub:
            _measure("public forward, plan=", fwd["public, plan="])
            _measure("public forward, own plan", fwd["public, own plan"])
            _measure("public fwd+bwd, plan=", bwd["public fwd+bwd, plan="])
            _graphs(b, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
