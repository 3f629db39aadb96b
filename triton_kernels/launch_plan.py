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

import functools
import struct
import sys
import threading
import types
from dataclasses import dataclass

import torch

# False: every call through the launcher.
ENABLED = True
MAX_PLANS = 512  # keys kept per launcher; past it the plans start afresh
_ALIGN = 256  # byte alignment of each workspace buffer inside the one allocation


class _Local(threading.local):
    recorder: _Recorder | None = None  # the call this thread is recording, if any


_local = _Local()


def _recording() -> _Recorder | None:
    return _local.recorder  # (a class default: getattr's default cost 0.36 µs a call on a CI core)


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
    native: object = None  # specops._C.LaunchPlan of the same launches (CUDA builds), or None

    def replay(self, args: tuple, device: torch.device, stream: int, pointers: list[int] | None = None):
        """The outputs of a call with ``args`` (``pointers``: each argument's data pointer, 0
        for a non-tensor, when the caller has them)."""
        if pointers is None:
            pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else 0 for a in args]
        if self.native is not None:
            outs = self.native.replay(pointers, stream)
            if outs is not None:
                return tuple(outs)
            # None: an allocation or a launch failed in C++; the kernels' own launchers below
            # redo the call and raise the error as Python exceptions.
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        scratch = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device) if self.workspace_bytes else None
        base = scratch.data_ptr() if scratch is not None else 0
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


# Kernel parameter types (Triton's signature strings) -> struct format, as Triton's C
# launcher stores each (bools and 8-bit ints in a byte, floats as float32 / float64 bits).
_SCALAR_FORMATS = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
                   "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}
_POINTER = 0  # placeholder bits of a pointer the replay writes


def _native_launch(kernel, grid, launch_args, sources):
    """One launch for specops._C.LaunchPlan: its parameters packed as the kernel takes them
    (every non-constexpr argument in order, then Triton's two scratch pointers, 0), or None
    where a type is not one the packing knows. ``sources`` maps an argument index to
    (source, index) for the pointers a replay writes (0 input, 1 output, 2 workspace)."""
    signature = list(getattr(getattr(kernel, "src", None), "signature", {}).values())
    if len(signature) != len(launch_args):
        return None
    packed, offsets, patches = bytearray(), [], []
    for at, (kind, value) in enumerate(zip(signature, launch_args)):
        if kind == "constexpr":
            continue
        offsets.append(len(packed))
        if isinstance(kind, str) and kind.startswith("*"):
            if at in sources:
                patches.append((len(packed), *sources[at]))
                value = _POINTER
            elif isinstance(value, torch.Tensor):
                value = value.data_ptr()  # a persistent buffer (or no bytes at all)
            if not isinstance(value, int):
                return None
            packed += struct.pack("Q", value)
        elif kind in _SCALAR_FORMATS:
            try:
                packed += struct.pack(_SCALAR_FORMATS[kind], value)
            except (struct.error, OverflowError, TypeError):  # out of the type's range: left to the launchers
                return None
        else:
            return None
        packed += bytes(-len(packed) % 8)
    for _ in range(2):  # Triton's global and profile scratch pointers: none (checked by the caller)
        offsets.append(len(packed))
        packed += bytes(8)
    num_warps, num_ctas, shared = kernel.packed_metadata
    run = kernel.run
    return (kernel.function, grid, 32 * num_warps, shared, num_ctas, bool(run.launch_pdl),
            bool(run.launch_cooperative_grid), bytes(packed), offsets, patches)


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
    launches, native_launches = [], []
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
        sources = {at: (0, which) for at, which in inputs}
        sources.update({at: (1, which) for at, which in outputs})
        sources.update({at: (2, offset) for at, offset in scratch})
        native_launches.append(_native_launch(kernel, grid, launch_args, sources))
    native = None
    native_class = _native_plan_class()
    if native_class is not None and all(n is not None for n in native_launches):
        native = native_class(list(recorder.outputs), total, len(args), native_launches)
        if native.error:  # malformed (never from _native_launch's records): the launchers replay
            native = None
    return _Plan(tuple((tuple(o.shape), o.dtype) for o in recorder.outputs), total, tuple(launches), native)


# False: plans replay through each kernel's Python launcher even where specops._C has
# LaunchPlan (tests compare the two forms).
NATIVE = True


@functools.cache
def _native_module():
    """specops._C where it has the native replay (CUDA builds), else None."""
    try:
        from specops import _C
    except ImportError:
        return None
    return _C if hasattr(_C, "LaunchPlan") and hasattr(_C, "plan_key") else None


def _native_key():
    """specops._C.plan_key (a call's key and pointers in one C++ pass), or None: keys built
    in Python."""
    native = _native_module()
    return native.plan_key if native is not None else None


def _native_plan_class():
    """specops._C.LaunchPlan where built and enabled (NATIVE), else None."""
    native = _native_module()
    return native.LaunchPlan if NATIVE and native is not None else None


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
        first = args[0] if isinstance(args[0], torch.Tensor) else next(a for a in args if isinstance(a, torch.Tensor))
        device = first.device
        # (torch._C's device and capture queries: CUDA is initialised, a CUDA tensor exists)
        if (not ENABLED or _modified or not first.is_cuda or _recording() is not None
                or torch._C._cuda_isCurrentStreamCapturing() or observed()):
            if check is not None:
                check(*args)
            return launcher(*args)
        current = torch._C._cuda_getDevice()
        stream = torch._C._cuda_getCurrentRawStream(current)
        native_key = _native_key()
        keyed = native_key(args) if native_key is not None else None
        if keyed is not None:
            key, pointers = (current, stream, keyed[0]), keyed[1]
        else:
            key, pointers = (current, stream, *((a.shape, a.dtype, a.device, a.is_contiguous(), a.data_ptr() % 16 == 0)
                                                if isinstance(a, torch.Tensor) else a for a in args)), None
        plan = plans.get(key)
        if plan is not None and plan is not _UNPLANNED:
            return plan.replay(args, device, stream, pointers)
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
    when first tracked (a test or bench tool that sets one runs the launchers as they are)."""
    if module_name in _ORIGINALS:  # tracked already (by another launcher): as it was then
        return
    module = sys.modules[module_name]
    _ORIGINALS[module_name] = dict(vars(module))
    module.__class__ = _TrackedModule


def plans_active() -> bool:
    """Whether eager calls may replay plans now (for tests)."""
    return ENABLED and not _modified
