"""The phase transition's closed forms against numerical integration, and the theory's
claims about t0, omega_1 and B_n."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad

from scansnap_lens import theory
from scansnap_lens.theory import PhaseTransition


@pytest.mark.parametrize("M,lr_y", [(34, 1.0), (1000, 0.5), (1000, 10.0)])
def test_h_implicit_solution_equals_numerical_integration(M, lr_y):
    s = np.array([0.0, 0.01, 0.3, 2.0, 17.0, 250.0, 4000.0])
    np.testing.assert_allclose(
        theory.h(s, M, lr_y), theory.h(s, M, lr_y, "ode"), rtol=1e-7, atol=1e-12
    )


def test_h_satisfies_its_differential_equation():
    M, lr_y, s, ds = 1000, 2.0, np.array([0.5, 5.0, 50.0]), 1e-6
    slope = (theory.h(s + ds, M, lr_y) - theory.h(s - ds, M, lr_y)) / (2 * ds)
    np.testing.assert_allclose(slope, lr_y / (M - 1 + np.exp(M * theory.h(s, M, lr_y))), rtol=1e-5)


@pytest.mark.parametrize("lr_y,lr_z,rho0", [(1.0, 0.5, 1.0), (10.0, 0.5, 0.7), (0.5, 2.0, 1.3)])
def test_closed_form_B_matches_numerical_integration_of_xi(lr_y, lr_z, rho0):
    pt = PhaseTransition(K=10, M=1000, lr_y=lr_y, lr_z=lr_z, rho0=rho0)
    for t in [5.0, 60.0, 700.0, 9000.0]:
        integral = lr_z * quad(pt.xi, 0, t, limit=800, points=[pt.t0_prime])[0]
        assert integral == pytest.approx(pt.B(t) - pt.B(0.0), rel=1e-6)
        assert integral == pytest.approx(pt.B_integral(t), rel=1e-6)


def test_big_gamma_is_the_integral_of_gamma():
    K, M, lr_y, lr_z = 10, 1000, 1.0, 0.5
    for t in [20.0, 500.0]:
        integral = lr_z * quad(lambda u: theory.gamma(u, K, M, lr_y), 0, t, limit=800)[0]
        assert integral == pytest.approx(theory.big_gamma(t, K, M, lr_y, lr_z), rel=1e-6)


def test_t0_scales_as_one_over_lr_y_and_marks_the_lemma8_crossing():
    base = PhaseTransition(10, 1000, 1.0, 0.5)
    for lr_y in [0.5, 2.0, 10.0]:
        pt = PhaseTransition(10, 1000, lr_y, 0.5)
        assert pt.t0 * lr_y == pytest.approx(base.t0, rel=1e-12)
        assert pt.t0_prime * lr_y == pytest.approx(base.t0_prime, rel=1e-12)
        # at t0, M h(t0/K) reaches the zero point (1 + omega_1) ln M of Lemma 8 (to (M-1)/M)
        Mh = 1000 * theory.h(pt.t0 / 10, 1000, lr_y)
        assert Mh == pytest.approx((1 + pt.delta) * np.log(1000), rel=2e-3)


def test_omega1_solves_its_equation():
    for M in [34, 1000, 10**6]:
        w = theory.omega1(M)
        assert M ** (1 + w) == pytest.approx((M - 1) * (1 + w) * np.log(M), rel=1e-9)


def test_snap_makes_B_grow_like_log_log():
    pt = PhaseTransition(10, 1000, 1.0, 0.5)
    early = pt.B_integral(pt.t0_prime) - pt.B_integral(pt.t0_prime / 10)
    late = pt.B_integral(100 * pt.t0) - pt.B_integral(10 * pt.t0)
    assert early > 4 * late > 0  # a decade before scanning ends vs a decade well after the snap


def test_larger_lr_y_gives_denser_attention_at_fixed_lr_z():
    t = 1e5
    dense = PhaseTransition(10, 1000, 10.0, 0.5).chi_bounds(t)[1]
    sparse = PhaseTransition(10, 1000, 1.0, 0.5).chi_bounds(t)[1]
    assert sparse > dense
    lo, hi = PhaseTransition(10, 1000, 1.0, 0.5).chi_bounds(np.array([0.0, 10.0]), f0_sq=0.3)
    assert lo[0] == hi[0] == 1.0 and lo[1] < hi[1]


def test_bad_input():
    with pytest.raises(ValueError, match="lr_y"):
        PhaseTransition(10, 1000, 0.0, 0.5)
    with pytest.raises(ValueError, match="K >= 1"):
        PhaseTransition(0, 1000, 1.0, 0.5)
    with pytest.raises(ValueError, match="non-negative"):
        theory.h(np.array([-1.0]), 100, 1.0)
