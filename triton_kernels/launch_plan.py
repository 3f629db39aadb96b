"""Eager calls of a Triton launcher replayed from a plan of its launches.

An eager Triton ``verify`` spends most of its time on the host: the launcher's Python
(sizes, splits, a dozen ``torch.empty``), then per launch Triton's binder and its launcher
turning each tensor into a pointer (bench/NOTES.md). For one set of argument shapes,
dtypes, pointer alignments, host values, device and stream, all of that comes out the
same every call: the launches, their grids, their scalar arguments and which tensor goes
where. Only the pointers change. So the first call whose kernels are all compiled is
recorded, and later calls with the same key replay the record: the outputs and one
workspace allocated, each launch's arguments rebuilt from the new pointers, each compiled
kernel launched by its launcher.

A record holds only what it can rebuild: every tensor a launch takes must be an argument
of the call, an output or workspace the launcher allocated here (``output``,
``workspace``), or a buffer registered as persistent (``persistent``: the same every call
on the key's stream); any other tensor (a fill, a view of an argument) leaves the key
unplanned, run by the launcher every call. Nothing is planned while a CUDA graph is being
captured, while Triton's launch hooks, debug or instrumentation knobs are set, or while an
attribute of a tracked module (the launchers' constants, kernels and helpers: ``track``)
differs from its value at import, as tests and bench/ab_verify.py set them.
"""

from __future__ import annotations

import sys
import threading
import types
from dataclasses import dataclass

import torch

# False: every call through the launcher.
ENABLED = True
MAX_PLANS = 512  # keys kept per launcher; past it the plans start afresh
_ALIGN = 256  # byte alignment of each workspace buffer inside the one allocation

_local = threading.local()  # .recorder: the call this thread is recording, if any


def _recording() -> _Recorder | None:
    return getattr(_local, "recorder", None)


def output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output of the launcher: torch.empty, allocated afresh by a replay."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    recorder = _recording()
    if recorder is not None:
        recorder.outputs.append(tensor)
    return tensor


def workspace(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch buffer of the launcher (torch.empty: nothing may rely on its contents), a
    slice of one allocation in a replay."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    recorder = _recording()
    if recorder is not None:
        recorder.workspace.append(tensor)
    return tensor


# Storage pointer -> the buffer, held for good: its memory is never handed to another
# tensor that a record could mistake for it.
_PERSISTENT: dict[int, torch.Tensor] = {}


def persistent(tensor: torch.Tensor) -> torch.Tensor:
    """Registers ``tensor``'s storage as a buffer a record may keep: one the launcher hands
    every call on a given device and stream (zeroed counters, say)."""
    _PERSISTENT[tensor.untyped_storage().data_ptr()] = tensor
    return tensor


def report_launch(kernel, grid: tuple[int, int, int], args: tuple) -> None:
    """launch.DirectLaunch's report of a launch of a compiled kernel, kept while recording."""
    recorder = _recording()
    if recorder is not None:
        recorder.launches.append((kernel, grid, args))


def report_slow_launch() -> None:
    """launch.DirectLaunch's report of a launch it could not make directly (a compile, a
    hook): a call being recorded is not kept."""
    recorder = _recording()
    if recorder is not None:
        recorder.complete = False


class _Recorder:
    def __init__(self):
        self.outputs: list[torch.Tensor] = []
        self.workspace: list[torch.Tensor] = []
        self.launches: list = []
        self.complete = True


@dataclass(frozen=True)
class _Launch:
    launch: object  # the compiled kernel's C launcher (its Python wrapper has nothing to do here)
    grid: tuple[int, int, int]
    head: tuple  # the launcher's arguments between the stream and the kernel's own
    constants: tuple  # the arguments, pointers of rebuilt tensors as placeholders
    inputs: tuple[tuple[int, int], ...]  # (argument index, call argument index)
    outputs: tuple[tuple[int, int], ...]  # (argument index, output index)
    scratch: tuple[tuple[int, int], ...]  # (argument index, byte offset into the workspace)


@dataclass(frozen=True)
class _Plan:
    outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    workspace_bytes: int
    launches: tuple[_Launch, ...]

    def replay(self, args: tuple, device: torch.device, stream: int):
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        scratch = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device) if self.workspace_bytes else None
        base = scratch.data_ptr() if scratch is not None else 0
        pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        out_pointers = [o.data_ptr() for o in outs]
        for step in self.launches:
            values = list(step.constants)
            for at, which in step.inputs:
                values[at] = pointers[which]
            for at, which in step.outputs:
                values[at] = out_pointers[which]
            for at, offset in step.scratch:
                values[at] = base + offset
            step.launch(*step.grid, stream, *step.head, *values)
        return tuple(outs)


def _plan_of(recorder: _Recorder, args: tuple, returned) -> _Plan | None:
    """The record of one call, or None where a tensor it launched with cannot be rebuilt."""
    if not recorder.launches:
        return None
    if (not isinstance(returned, tuple) or len(returned) != len(recorder.outputs)
            or any(r is not o for r, o in zip(returned, recorder.outputs))):
        return None  # the launcher returned something other than its outputs, in order
    offsets, total = [], 0
    for buffer in recorder.workspace:
        offsets.append(total)
        total += -(-buffer.untyped_storage().nbytes() // _ALIGN) * _ALIGN
    spans = [(b.untyped_storage().data_ptr(), b.untyped_storage().nbytes(), offset)
             for b, offset in zip(recorder.workspace, offsets)]
    launches = []
    for kernel, grid, launch_args in recorder.launches:
        constants, inputs, outputs, scratch = list(launch_args), [], [], []
        for at, value in enumerate(launch_args):
            if not isinstance(value, torch.Tensor):
                continue
            constants[at] = None
            which = next((i for i, a in enumerate(args) if a is value), None)
            if which is not None:
                inputs.append((at, which))
                continue
            which = next((i for i, o in enumerate(recorder.outputs) if o is value), None)
            if which is not None:
                outputs.append((at, which))
                continue
            pointer = value.data_ptr()
            span = next(((start, offset) for start, size, offset in spans if start <= pointer < start + size), None)
            if span is not None:
                scratch.append((at, span[1] + pointer - span[0]))
            elif value.numel() == 0 or _PERSISTENT.get(value.untyped_storage().data_ptr()) is not None:
                constants[at] = pointer  # the same buffer every call (or no bytes at all)
            else:
                return None
        run = kernel.run  # Triton's CudaLauncher: without scratch memory, its C launch as it calls it
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None
        head = (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None, kernel.packed_metadata,
                None, None, None)
        launches.append(_Launch(run.launch, grid, head, tuple(constants), tuple(inputs), tuple(outputs),
                                tuple(scratch)))
    return _Plan(tuple((tuple(o.shape), o.dtype) for o in recorder.outputs), total, tuple(launches))


_UNPLANNED = object()


def planned(launcher):
    """``launcher`` (a function of tensors, None and host values that launches Triton
    kernels and returns a tuple of its outputs) with its eager CUDA calls replayed from
    plans. Called as ``planned_launcher(*args, check=check)``, ``check(*args)`` (the
    arguments' checks, which raise on bad ones) runs before the launcher, and is skipped
    where a plan replays: a plan's key (each tensor's shape, dtype, device, contiguity and
    16-byte alignment, the host values) is that of a call that passed it."""
    from .launch import observed

    plans: dict = {}

    def call(*args, check=None):
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if (not ENABLED or _modified or device.type != "cuda" or _recording() is not None
                or torch.cuda.is_current_stream_capturing() or observed()):
            if check is not None:
                check(*args)
            return launcher(*args)
        current = torch.cuda.current_device()
        stream = torch._C._cuda_getCurrentRawStream(current)
        key = (current, stream, *((a.shape, a.dtype, a.device, a.is_contiguous(), a.data_ptr() % 16 == 0)
                                  if isinstance(a, torch.Tensor) else a for a in args))
        plan = plans.get(key)
        if plan is not None and plan is not _UNPLANNED:
            return plan.replay(args, device, stream)
        if check is not None:
            check(*args)
        if plan is _UNPLANNED:
            return launcher(*args)
        _local.recorder = recorder = _Recorder()
        try:
            returned = launcher(*args)
        finally:
            _local.recorder = None
        if recorder.complete:  # else: not all compiled yet, record a later call
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plans[key] = _plan_of(recorder, args, returned) or _UNPLANNED
        return returned

    call.plans = plans
    return call


# ---- tracked modules: plans only while their attributes are as imported ----

_ORIGINALS: dict[str, dict] = {}  # module name -> its attributes when tracked
_modified: set[tuple[str, str]] = set()  # (module, attribute) set to another value


class _TrackedModule(types.ModuleType):
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        _changed(self.__name__, name, value)

    def __delattr__(self, name):
        super().__delattr__(name)
        _changed(self.__name__, name, _MISSING)


_MISSING = object()


def _changed(module: str, name: str, value) -> None:
    if value is _ORIGINALS[module].get(name, _MISSING):
        _modified.discard((module, name))
    else:
        _modified.add((module, name))


def track(module_name: str) -> None:
    """Plans run only while every attribute of module ``module_name`` is the object it was
    when tracked (a test or bench tool that sets one runs the launchers as they are)."""
    module = sys.modules[module_name]
    _ORIGINALS[module_name] = dict(vars(module))
    module.__class__ = _TrackedModule


def plans_active() -> bool:
    """Whether eager calls may replay plans now (for tests)."""
    return ENABLED and not _modified
