"""Shared test set-up: hypothesis profiles, the backends present on this machine, and
helpers that build ragged sampling batches from fresh random data."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import specops
from specops.backend import Backend

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=25,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "nightly", deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# CPU runs: the interpreter's redundant patching skipped (SPECOPS_INTERPRETER_SPEEDUP=0: not)
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("SPECOPS_INTERPRETER_SPEEDUP") != "0":
    import interpreter_speedup

    interpreter_speedup.install()

# Under pytest-xdist each worker's torch would take every core for its intra-op threads
# (8 workers x 16 threads on a 16-core GPU host): each worker gets its share of the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // _WORKERS))

HAS_CUDA = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def pytest_runtest_logreport(report):
    """With SPECOPS_TEST_TIMES=PATH, each test's setup and call time and outcome appended to
    PATH as it ends (one line a phase, by the main process alone under xdist): a run cut
    short by a time limit still tells which tests ran and what they took."""
    path = os.environ.get("SPECOPS_TEST_TIMES")
    if not path or report.when == "teardown" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a") as times:
        times.write(f"{report.duration:8.2f} {report.when:5s} {report.outcome:7s} {report.nodeid}\n")


if HAS_CUDA and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":

    @pytest.fixture(autouse=True)
    def _captures_left_to_the_allocator(request):
        """memcheck's first pass runs with the caching allocator off (a read past a tensor's
        end is caught only then), where a CUDA graph capture fails (cudaMalloc while
        capturing): a test is skipped where it would capture, its id appended to
        SPECOPS_CAPTURE_SKIPS when set, for the pass that runs those with the allocator on
        (scripts/gpu_check.sh memcheck). No name convention to keep."""

        def skip(graph):
            path = os.environ.get("SPECOPS_CAPTURE_SKIPS")
            if path:
                with open(path, "a") as skips:
                    skips.write(request.node.nodeid + "\n")
            pytest.skip("captures a CUDA graph, which needs the caching allocator")

        # A patch of its own: a test's monkeypatch.undo() would also undo one made with the
        # test's shared monkeypatch fixture, and its capture then ran with the allocator off.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.cuda.graph, "__enter__", skip)
            yield


@pytest.fixture
def triton_verify():
    """The Triton verify launcher's module (its flags and kernels, for monkeypatching)."""
    from specops.triton_kernels import verify

    return verify


@pytest.fixture
def chosen_backends(monkeypatch):
    """The backends specops.ops._op is asked for from now on, in call order (a spy on the
    op lookup of every public call; the calls still run)."""
    chosen = []
    op = specops.ops._op
    monkeypatch.setattr(specops.ops, "_op", lambda name, backend, *rest: chosen.append(backend) or op(name, backend, *rest))
    return chosen


def launch_grids(monkeypatch, module, name: str) -> list:
    """The grids of every launch of kernel ``name`` of ``module`` from now on (the launches
    still run), in order."""
    grids = []
    kernel = getattr(module, name)

    class Recorded:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(module, name, Recorded())
    return grids


def capture(step, warmups: int = 1, stream: torch.cuda.Stream | None = None):
    """``step`` run ``warmups`` times on a side stream (compiles and allocates outside the
    graph), then captured in a CUDA graph (on ``stream`` when given): (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outputs = step()
    return graph, outputs


def kernel_backends(device: str) -> list[Backend]:
    """The backends under test on ``device``: every available one but the reference."""
    return [b for b in specops.available_backends(torch.device(device)) if b is not Backend.REFERENCE]


def backend_params() -> list:
    """(device, backend) pairs present on this machine; GPU pairs carry the gpu marker."""
    params = [pytest.param("cpu", b, id=f"cpu-{b.value}") for b in kernel_backends("cpu")]
    if HAS_CUDA:
        params += [
            pytest.param("cuda", b, id=f"cuda-{b.value}", marks=pytest.mark.gpu) for b in kernel_backends("cuda")
        ]
    return params
