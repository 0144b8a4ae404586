"""pytest plugin of jagflash (registered through the ``pytest11`` entry point).

- Markers ``gpu`` (needs a CUDA device), ``sm90`` (needs compute capability 9.0) and
  ``interpret`` (needs Triton's interpreter on), resolved at collection, never at import.
- Hypothesis profiles ``ci`` (few examples, derandomised, no deadline) and ``nightly`` (many);
  ``HYPOTHESIS_PROFILE`` picks one, ``ci`` by default.
- Every kernel output buffer is NaN-poisoned during tests (``jagflash.core.ops.poison_outputs``),
  so an element a kernel forgets to write fails the comparison.
- :func:`require` skips a test with a spec's own reasons when a backend cannot run a problem.
- ``--shard I/N`` keeps every N-th selected test from the I-th on (1-based): a suite too long for
  one device call runs as N calls that each take a share of every test file.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from jagflash.core.capability import Problem, VariantSpec, not_supported_reasons

# Twelve property tests draw from these: ``ci`` gives the suite 12 x 25 = 300 examples, ``nightly``
# 12 x 850 = 10,200 (``nox -s nightly``).
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "nightly",
    max_examples=850,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard", default=None, metavar="I/N",
        help="run only the I-th of N round-robin shares of the selected tests (1-based)",
    )


def _shard(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes I/N with integers, got {value!r}") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard I/N needs 1 <= I <= N, got {value!r}")
    return i, n


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line("markers", "sm90: needs an sm_90 (Hopper) GPU")
    config.addinivalue_line("markers", "interpret: runs Triton kernels under TRITON_INTERPRET=1")


def _skip_reason(keywords) -> str | None:
    import torch

    if ("gpu" in keywords or "sm90" in keywords) and not torch.cuda.is_available():
        return "no CUDA device"
    if "sm90" in keywords and torch.cuda.get_device_capability() != (9, 0):
        major, minor = torch.cuda.get_device_capability()
        return f"needs sm_90, this GPU is sm_{major}{minor}"
    if "interpret" in keywords:
        from jagflash.core.backend import interpreter_reasons

        reasons = interpreter_reasons()
        if reasons:
            return "; ".join(reasons)
    return None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After a GPU test, its cached blocks go back to the device: the GPU suite runs in several
    xdist workers on one GPU, and a worker's caching allocator otherwise keeps its largest
    test's memory (8 workers held 10-31 GiB each and starved a 139 GiB H200: 2026-12-02,
    session 13, call 3)."""
    if "gpu" in item.keywords or "sm90" in item.keywords:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs (for --shard)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = _skip_reason(item.keywords)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    if config.getoption("shard") is None:
        return
    i, n = _shard(config.getoption("shard"))
    dropped = [item for k, item in enumerate(items) if k % n != i - 1]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = [item for k, item in enumerate(items) if k % n == i - 1]


@pytest.fixture(autouse=True)
def _poison_kernel_outputs():
    from jagflash.core.ops import poison_outputs

    previous = poison_outputs(True)
    yield
    poison_outputs(previous)


@pytest.fixture
def device() -> str:
    """The device the kernels under test run on: CUDA when present, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def require(spec: VariantSpec, problem: Problem, backend: str | None = None) -> None:
    """Skip with ``spec``'s own reasons when it cannot run ``problem`` (on ``backend``)."""
    import torch

    from jagflash.core.backend import device_capability

    if problem.device_type == "cuda" and torch.cuda.is_available():
        problem = problem.with_capability(device_capability(torch.device("cuda")))
    reasons = not_supported_reasons(spec, problem, backend)
    if reasons:
        pytest.skip(f"{spec.name} cannot run this here: " + "; ".join(reasons))
