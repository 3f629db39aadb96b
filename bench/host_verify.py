"""Where an eager specops.verify call spends its host time: each backend's eager call
against its graph replay (the difference is host time; Triton's through JITFunction.run,
launched directly and replayed from plans, in alternating rounds) and with the value
checks (validate=True), then cProfile over eager calls of one backend. Usage (GPU):

    python bench/host_verify.py --shape 1:4:128256:random --backend triton
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from ab_verify import graph_of, shape_call

import common
import specops
from specops.triton_kernels import launch, launch_plan
from specops.triton_kernels import verify as verify_kernels


def host_us(fn, calls: int = 40) -> float:
    """Host time of one call: ``calls`` calls queued behind a sleep kernel (the GPU never
    waits on the host and the host never waits on the GPU), wall time / calls."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1:4:128256:random")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    label, call, logprobs = shape_call(args.shape, device)
    for backend in ("cuda", "triton"):
        def eager(backend=backend):
            return specops.verify(*call, logprobs, backend=backend, validate=False)
        replay = graph_of(eager).replay
        replay_us = common.time_us(replay, device, iters=100)
        print(f"{label} {backend}: graph replay {replay_us:.1f} us", flush=True)
        # Eager, the Triton kernels launched through JITFunction.run, directly (launch.DIRECT),
        # and replayed from plans (launch_plan.ENABLED), in alternating rounds.
        # (direct, planned, native): plans replayed by specops._C.LaunchPlan or by each kernel's
        # Python launcher (launch_plan.NATIVE; a form change records the plans afresh).
        forms = (((False, False, False), (True, False, False), (True, True, False), (True, True, True))
                 if backend == "triton" else ((True, True, True),))
        names = {(False, False, False): " (JITFunction.run)", (True, False, False): " (direct launches)",
                 (True, True, False): " (plans, Python replay)", (True, True, True): " (plans, native replay)"}
        for _ in range(3 if backend == "triton" else 1):
            for form in forms:
                launch.DIRECT, launch_plan.ENABLED, launch_plan.NATIVE = form
                verify_kernels.verify.plans.clear()
                eager_us = common.time_us(eager, device, iters=100)
                how = names[form] if backend == "triton" else ""
                print(f"  eager{how} {eager_us:.1f} us, host {host_us(eager):.1f} us", flush=True)
        # With the value checks (validate=True, the default: one device sync a call).
        def validated(backend=backend):
            return specops.verify(*call, logprobs, backend=backend)
        print(f"  eager, validate=True {common.time_us(validated, device, iters=100):.1f} us", flush=True)

    def calls():
        for _ in range(args.calls):
            specops.verify(*call, logprobs, backend=args.backend, validate=False)
        torch.cuda.synchronize()

    print_profile(calls, args.top)


def print_profile(run, top: int) -> None:
    """cProfile of ``run()`` (after one unprofiled run), by own time, then cumulative."""
    run()
    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main()
