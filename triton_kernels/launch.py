"""What the GPU offers the Triton launchers, read once per device."""

from __future__ import annotations

import functools

import torch

from . import launch_plan


@functools.cache
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _cuda_properties(device: torch.device):
    return _properties(_index(device))


def multiprocessor_count(device: torch.device, off_gpu: int) -> int:
    """Streaming multiprocessors of ``device``; ``off_gpu`` off a GPU (the interpreter),
    which the caller picks: a GPU's count to plan as on it, or a few to exercise splits."""
    if device.type != "cuda":
        return off_gpu
    return _cuda_properties(device).multi_processor_count


@functools.cache
def _dram_gbs(index: int) -> float:
    from triton.runtime import driver  # Triton's driver reads the memory clock and bus width from CUDA

    properties = driver.active.utils.get_device_properties(index)
    return properties["mem_clock_rate"] * properties["mem_bus_width"] * 2 / 8 / 1e6  # kHz x bits, DDR


def dram_gbs_per_multiprocessor(device: torch.device) -> int:
    """Peak memory bandwidth of ``device`` shared by each multiprocessor, GB/s, from its memory
    clock and bus width (an H100 SXM by its datasheet: 3352 / 132 = 25; an H200 read 36);
    0 off a GPU."""
    if device.type != "cuda":
        return 0
    return int(_dram_gbs(_index(device)) / _cuda_properties(device).multi_processor_count)


def has_pdl(device: torch.device) -> bool:
    """Whether ``device`` has programmatic dependent launch (griddepcontrol: sm_90+); never
    off a GPU (the interpreter runs no inline PTX)."""
    return device.type == "cuda" and _cuda_properties(device).major >= 9


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints (``triton.cdiv`` is a constexpr function: a few µs a call on
    the host, and a verify call makes ~20)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= ``n`` for host ints, 0 for ``n`` <= 0, as
    ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


# False: every launch through JITFunction.run (bench/host_verify.py compares the two).
DIRECT = True


class DirectLaunch:
    """A ``@triton.jit`` kernel launched, once compiled, by its compiled launcher.

    ``JITFunction.run`` redoes on every launch what cannot change between specops' calls:
    the check that the globals a kernel read are unchanged (a constexpr comparison each),
    the cache key's strings, the launch hooks' metadata, and it calls the (empty) launch
    hooks. That is most of an eager Triton verify call's host time (bench/NOTES.md). Here
    Triton's own binder still specializes every argument (dtypes, 16-byte alignment,
    integers equal to 1 or divisible by 16, constexprs, options), and its result keys the
    compiled kernels; a key seen before launches at once. The first launch of a key, and
    every launch while the kernel has pre-run hooks, or launch hooks or Triton's debug or
    instrumentation knobs are set, go through ``JITFunction.run`` as before. The kernel's
    globals are module constants: the first launch of each key checks them, later ones do
    not.
    """

    def __init__(self, fn):
        self.fn = fn
        self.kernels = {}  # (device, specialization, options) -> CompiledKernel

    def __getattr__(self, name):  # the JITFunction's attributes (its name, signature, ...)
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, **kwargs):
        if not DIRECT or callable(grid) or self.fn.pre_run_hooks or observed():
            launch_plan.report_slow_launch()
            return self.fn[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        bound, specialization, options = self.fn.device_caches[device][4](*args, **kwargs)
        try:
            key = (device, *specialization, *options.items())
            kernel = self.kernels.get(key)
        except TypeError:  # an unhashable constexpr: no direct launch
            launch_plan.report_slow_launch()
            return self.fn[grid](*args, **kwargs)
        if kernel is None:
            launch_plan.report_slow_launch()
            kernel = self.fn[grid](*args, **kwargs)
            if kernel is not None and not hasattr(kernel, "result"):  # not an asynchronous compile
                self.kernels[key] = kernel
            return kernel
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        values = tuple(bound.values())
        kernel.run(grid[0], grid_1, grid_2, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *values)
        launch_plan.report_launch(kernel, (grid[0], grid_1, grid_2), values)
        return kernel


def observed() -> bool:
    """Whether Triton's launch hooks, debug or instrumentation knobs are set: JITFunction.run
    serves them. (Every eager launch and planned call asks: no import or list here, 0.6 ->
    0.3 µs on a CI core.)"""
    knobs = _knobs()
    runtime = knobs.runtime
    return bool(_hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook) or runtime.debug
                or knobs.compilation.instrumentation_mode)


def _hooked(hook) -> bool:
    """A launch hook set: a plain callable, or a chain (Triton's HookChain) holding one."""
    return hook is not None and bool(getattr(hook, "calls", True))


@functools.cache
def _knobs():
    from triton import knobs

    return knobs


# The Triton releases whose JITFunction.run DirectLaunch mirrors (its per-device caches end
# with the binder; CompiledKernel.run's arguments); under others kernels launch as usual.
DIRECT_TRITON_RELEASES = ("3.6.",)


def direct_launch(fn):
    """``fn`` (a ``@triton.jit`` kernel) as a DirectLaunch; the interpreter's kernels, and any
    kernel under a Triton release not in DIRECT_TRITON_RELEASES, as they are."""
    import triton
    from triton.runtime.jit import JITFunction

    if isinstance(fn, JITFunction) and triton.__version__.startswith(DIRECT_TRITON_RELEASES):
        return DirectLaunch(fn)
    return fn
