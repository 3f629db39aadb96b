"""Helpers of the launch-plan tests (tests/test_*launch_plan.py): the replays counted, and
whether the native replay is built."""

from __future__ import annotations

import pytest

from specops.triton_kernels import launch_plan

# Both replay forms: specops._C.LaunchPlan (CUDA builds) and the kernels' own launchers
# (a test sets launch_plan.NATIVE from ``native``).
both_forms = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])


def replays_of(monkeypatch, planned):
    """A fixture's body: the replays of plans from now on, counted (a list that grows);
    ``planned``'s plans recorded before are dropped, and again at the end."""
    counted = []
    real = launch_plan._Plan.replay

    def replay(self, *args):
        counted.append(self)
        return real(self, *args)

    monkeypatch.setattr(launch_plan._Plan, "replay", replay)
    planned.plans.clear()
    yield counted
    planned.plans.clear()


def native_built() -> bool:
    """Whether specops._C has the native replay (CUDA builds)."""
    return launch_plan._native_module() is not None
