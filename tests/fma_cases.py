"""float32 triples (a, b, c) for fused multiply-add tests, and a * b + c rounded once to
float32 by exact rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch


def fma_cases(count: int = 4000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(a, b, c, hard): ``count`` random triples over many binades and both signs, then
    ``hard`` triples whose a * b + c lies a hair (< half a float64 ulp) above the midpoint of
    two float32 neighbours: rounding a * b to float64, or the float64 sum, then to float32
    lands on the midpoint and rounds down to the even neighbour; rounded once it is the odd
    one above. c = s (1 + (2j + 1) 2^-23) 2^k, a b = -s 2^(k - 24) (1 - i^2 2^-46)."""
    g = torch.Generator().manual_seed(seed)

    def spread(n: int) -> torch.Tensor:
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        return (sign * torch.exp2(torch.rand(n, generator=g) * 40 - 20)).float()

    a, b, c = spread(count), spread(count), spread(count)
    c[: count // 2] = a[: count // 2] * b[: count // 2] * -0.75  # cancellation: the sum loses leading bits
    i = torch.randint(1, 362, (count,), generator=g, dtype=torch.float64)
    j = torch.randint(0, 2**22, (count,), generator=g, dtype=torch.float64)
    k = torch.randint(-30, 30, (count,), generator=g, dtype=torch.float64)
    s = torch.where(torch.rand(count, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    hard_a = (-s * (1 + i * 2.0**-23) * torch.exp2(k - 24)).float()
    hard_b = (1 - i * 2.0**-23).float()
    hard_c = (s * (1 + (2 * j + 1) * 2.0**-23) * torch.exp2(k)).float()
    return torch.cat([a, hard_a]), torch.cat([b, hard_b]), torch.cat([c, hard_c]), count


def fma_exact(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c rounded once to float32 (to nearest, ties to even), from the exact value."""
    out = []
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        near = np.float32(float(exact))  # within one float32 ulp of the answer
        candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
        errors = [abs(Fraction(float(v)) - exact) for v in candidates]
        best = min(errors)
        tied = [v for v, e in zip(candidates, errors) if e == best]
        out.append(float(min(tied, key=lambda v: int(np.array(v).view(np.int32)) & 1)))  # ties: even
    return torch.tensor(out, dtype=torch.float32)
