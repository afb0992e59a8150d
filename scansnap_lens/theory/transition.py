"""The paper's predictions for the snap (Theorem 1, Theorem 4, Appendix F), vectorised over t.

K next tokens, vocabulary M, decoder rate eta_Y (``lr_y``), attention rate eta_Z (``lr_z``):

  * h(s): h(0) = 0, dh/ds = eta_Y / (M - 1 + exp(M h)), with s = t / K.  Integrating once gives
    the implicit form exp(M h) + (M - 1) M h = M eta_Y s + 1 (Lemma 6), solved here by Newton's
    method; ``method="ode"`` integrates the differential equation numerically instead.
  * gamma(t) = (M-1)^2 h / (M - 1 + exp(M h)), Gamma(t) = (eta_Z/eta_Y) K (M-1)^2 h^2 / 2,
    xi(t) = gamma / (C0 + 4 Gamma), B_n(t) = ln(C0 + 4 Gamma) / 4 with C0 = rho0^4 / K.
  * t0' = K ln M / eta_Y (end of scanning), t0 = 2 (1 + delta') K ln M / eta_Y (snap), with
    delta' = omega_1(M) of Lemma 8.
  * rho0 from data (`rho0`): the initial overlap of the classes' normalised context
    distributions, f_n(0)^T f_n'(0) = 1 / rho0^2.
  * Theorem 3: exp(2 f0^2 B) <= chi_l0(t) <= exp(2 B) with B = eta_Z * integral_0^t xi.  The
    closed form (Eq. 124) drops the integration constant: eta_Z * integral_0^t xi equals
    B_n(t) - B_n(0) = ln(1 + 4 Gamma / C0) / 4 (``B_integral``), which is what the bounds use
    (so that chi(0) = 1 lies inside them).

>>> pt = PhaseTransition(K=10, M=1000, lr_y=1.0, lr_z=0.5)
>>> round(pt.t0_prime, 2), round(pt.t0 / pt.t0_prime, 3)
(69.08, 2.64)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

__all__ = ["B", "B_integral", "PhaseTransition", "big_gamma", "gamma", "h", "omega1", "rho0", "xi"]

ArrayLike = float | np.ndarray


def _check(K: float, M: float, lr_y: float) -> None:
    if K < 1 or M < 2:
        raise ValueError(f"need K >= 1 and M >= 2, got K={K}, M={M}")
    if K > M:
        raise ValueError(
            f"K={K} next tokens exceed the vocabulary M={M}: next tokens are tokens of the"
            " vocabulary (the paper's K <= M)"
        )
    if lr_y <= 0:
        raise ValueError(f"lr_y must be positive, got {lr_y}")


def h(s: ArrayLike, M: int, lr_y: float, method: str = "implicit") -> np.ndarray:
    """h(s) of Lemma 6 at s >= 0 (s = t / K), float64, same shape as ``s``."""
    _check(1, M, lr_y)
    s = np.asarray(s, dtype=np.float64)
    if (s < 0).any():
        raise ValueError("s must be non-negative")
    if method == "ode":
        flat = s.ravel()
        order = np.argsort(flat)
        sol = solve_ivp(
            lambda _, y: lr_y / (M - 1 + np.exp(M * y)),
            (0.0, float(flat.max(initial=0.0))),
            [0.0],
            t_eval=flat[order],
            rtol=1e-11,
            atol=1e-14,
            method="LSODA",
        )
        out = np.empty_like(flat)
        out[order] = sol.y[0]
        return out.reshape(s.shape)
    if method != "implicit":
        raise ValueError(f"method must be 'implicit' or 'ode', got {method!r}")
    # Solve g(u) = exp(u) + (M-1) u - R = 0 for u = M h.  g is convex and increasing, so
    # Newton from a point right of the root (where g >= 0) converges monotonically.
    R = M * lr_y * s + 1.0
    u = np.minimum(np.log(R), (R - 1.0) / (M - 1))
    for _ in range(100):
        step = (np.exp(u) + (M - 1) * u - R) / (np.exp(u) + (M - 1))
        u = u - step
        if np.all(np.abs(step) <= 1e-15 * np.maximum(1.0, np.abs(u))):
            break
    return u / M


def gamma(t: ArrayLike, K: int, M: int, lr_y: float) -> np.ndarray:
    """Speed control coefficient gamma(t) of Theorem 1."""
    hv = h(np.asarray(t, dtype=np.float64) / K, M, lr_y)
    return (M - 1) ** 2 * hv / (M - 1 + np.exp(M * hv))


def big_gamma(t: ArrayLike, K: int, M: int, lr_y: float, lr_z: float) -> np.ndarray:
    """Gamma(t) = eta_Z * integral_0^t gamma, in closed form (Eq. 128)."""
    hv = h(np.asarray(t, dtype=np.float64) / K, M, lr_y)
    return (lr_z / lr_y) * K * (M - 1) ** 2 * hv**2 / 2


def xi(t: ArrayLike, K: int, M: int, lr_y: float, lr_z: float, rho0: float = 1.0) -> np.ndarray:
    """xi_n(t) = gamma / (C0 + 4 Gamma) (Eq. 123)."""
    c0 = rho0**4 / K
    return gamma(t, K, M, lr_y) / (c0 + 4 * big_gamma(t, K, M, lr_y, lr_z))


def B(t: ArrayLike, K: int, M: int, lr_y: float, lr_z: float, rho0: float = 1.0) -> np.ndarray:
    """B_n(t) = ln(C0 + 4 Gamma(t)) / 4 (Eq. 129)."""
    return 0.25 * np.log(rho0**4 / K + 4 * big_gamma(t, K, M, lr_y, lr_z))


def B_integral(
    t: ArrayLike, K: int, M: int, lr_y: float, lr_z: float, rho0: float = 1.0
) -> np.ndarray:
    """eta_Z * integral_0^t xi = B_n(t) - B_n(0) = ln(1 + 4 Gamma(t) / C0) / 4."""
    return 0.25 * np.log1p(4 * big_gamma(t, K, M, lr_y, lr_z) * K / rho0**4)


def rho0(probs) -> float:
    """rho0 of Sec. 6 from data: the classes of one query start with f_n(0) = P(.|m, n) /
    ||P(.|m, n)||, and the paper's approximation f_n^T f_n' = exp(2 z) / rho0^2 with z(0) = 0
    defines rho0^-2 as their initial overlap.  Returns (mean over n != n' of
    f_n(0)^T f_n'(0))^(-1/2); inf when no two classes share a context token (common tokens are
    what drives xi), NaN for fewer than two classes.

    probs: [K, U] P(l|m, n) of the K classes of one query over U context tokens.

    >>> round(rho0(np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])), 6)  # overlap 1/2
    1.414214
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"probs must be [K, U], got shape {p.shape}")
    K = p.shape[0]
    if K < 2:
        return math.nan
    f = p / np.linalg.norm(p, axis=1, keepdims=True)
    # the Gram matrix's off-diagonal sum, ||sum_n f_n||^2 - K, without the K x K matrix
    total = f.sum(0)
    overlap = (total @ total - K) / (K * (K - 1))
    return math.inf if overlap <= 0 else float(overlap**-0.5)


def omega1(M: int) -> float:
    """omega_1 of Lemma 8: exp(M h) = (M-1) M h at h = (1 + omega_1) ln M / M."""
    if M < 3:
        raise ValueError(f"omega_1 needs M >= 3, got {M}")
    ln_m = np.log(M)

    def gap(w: float) -> float:
        return (1 + w) * ln_m - np.log(M - 1) - np.log1p(w) - np.log(ln_m)

    hi = 1.0
    while gap(hi) < 0:  # small M push the root past 1
        hi *= 2
    return float(brentq(gap, 0.0, hi, xtol=1e-14)) if gap(0.0) < 0 else 0.0


@dataclass(frozen=True)
class PhaseTransition:
    """Theory for one setting: K next tokens, vocabulary M, rates eta_Y and eta_Z."""

    K: int
    M: int
    lr_y: float
    lr_z: float
    rho0: float = 1.0

    def __post_init__(self) -> None:
        _check(self.K, self.M, self.lr_y)
        if self.lr_z <= 0:
            raise ValueError(f"lr_z must be positive, got {self.lr_z}")

    @property
    def delta(self) -> float:
        """delta' = omega_1(M)."""
        return omega1(self.M)

    @property
    def t0_prime(self) -> float:
        """End of the scanning phase, K ln M / eta_Y."""
        return float(self.K * np.log(self.M) / self.lr_y)

    @property
    def t0(self) -> float:
        """Snapping time 2 (1 + delta') K ln M / eta_Y."""
        return float(2 * (1 + self.delta) * self.K * np.log(self.M) / self.lr_y)

    def B(self, t: ArrayLike) -> np.ndarray:
        return B(t, self.K, self.M, self.lr_y, self.lr_z, self.rho0)

    def B_integral(self, t: ArrayLike) -> np.ndarray:
        return B_integral(t, self.K, self.M, self.lr_y, self.lr_z, self.rho0)

    def xi(self, t: ArrayLike) -> np.ndarray:
        return xi(t, self.K, self.M, self.lr_y, self.lr_z, self.rho0)

    def chi_bounds(self, t: ArrayLike, f0_sq: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Theorem 3 bounds on the growth factor of the dominant distinct token:
        (exp(2 f0^2 B), exp(2 B)) with B = ``B_integral(t)`` and f0^2 = f_{n l0}(0)^2."""
        b = self.B_integral(t)
        return np.exp(2 * f0_sq * b), np.exp(2 * b)

    def to_dataframe(self, t: ArrayLike) -> pd.DataFrame:
        """B_n, xi and the chi upper bound on the times ``t``, with the settings as columns."""
        t = np.asarray(t, dtype=np.float64)
        frame = pd.DataFrame({"t": t, "B": self.B(t), "xi": self.xi(t)})
        frame["B_integral"] = self.B_integral(t)
        frame["chi_upper"] = self.chi_bounds(t)[1]
        for key, value in asdict(self).items():
            frame[key] = value
        frame["t0_prime"], frame["t0"] = self.t0_prime, self.t0
        return frame
