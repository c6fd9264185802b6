"""PPO clip and CSD (sdar) losses: values and autograd gradients against hand-computed cases
(SPEC §3.2, §3.3 items 5–7)."""
import math

import pytest
import torch

from mimesis_lab.rl.losses import csd_loss, kl_penalty, ppo_clip_loss, sft_loss

approx = lambda x: pytest.approx(x, rel=1e-5, abs=1e-7)  # noqa: E731
sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


# ---------------------------------------------------------------- kl_penalty (k3)
def test_kl_penalty_value_and_gradient():
    # d = ref - logp = [0.5, -0.5, 0, (masked)] ; k3 = e^d - d - 1, N = 3
    # tok0: e^.5 - .5 - 1 = 0.148721 ; tok1: e^-.5 + .5 - 1 = 0.106531 ; tok2: 0
    # L = 0.255252 / 3 = 0.085084 ; dL/dlogp_k = (1 - e^d_k) / N = [-0.216240, +0.131157, 0, 0]
    e, ie = math.exp(0.5), math.exp(-0.5)
    logp = _t([-1.0, -1.0, -2.0, 5.0], grad=True)
    ref = _t([-0.5, -1.5, -2.0, float("nan")])
    loss = kl_penalty(logp, ref, _t([1.0, 1.0, 1.0, 0.0]))
    assert loss.item() == approx((e - 0.5 - 1 + ie + 0.5 - 1) / 3)
    assert loss.item() == approx(0.0850840)
    loss.backward()
    assert logp.grad.tolist() == approx([(1 - e) / 3, (1 - ie) / 3, 0.0, 0.0])
    assert ref.grad is None


def test_kl_penalty_is_zero_on_the_reference_and_non_negative():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 7, generator=g) > 0.3
    assert kl_penalty(logp, logp.clone(), mask).item() == 0.0
    assert kl_penalty(logp, logp + torch.randn(4, 7, generator=g, dtype=torch.float64), mask).item() > 0
    # an impossible reference token (log-prob -inf) is clamped, not an overflow
    assert math.isfinite(kl_penalty(_t([-1.0]), _t([-float("inf")]), _t([1.0])).item())
    empty = kl_penalty(_t([0.3], grad=True), _t([0.0]), _t([0.0]))
    assert empty.item() == 0.0


# ---------------------------------------------------------------- sft_loss (the ptx replay term)
def test_sft_loss_value_and_gradient():
    # logp = [-0.5, -2.0, -1.0, (masked nan)], N = 3: L = (0.5 + 2.0 + 1.0) / 3 = 7/6 ; dL/dlogp_k = -1/3 on the mask
    logp = _t([-0.5, -2.0, -1.0, float("nan")], grad=True)
    loss = sft_loss(logp, _t([1.0, 1.0, 1.0, 0.0]))
    assert loss.item() == approx(7 / 6)
    loss.backward()
    assert logp.grad.tolist() == approx([-1 / 3, -1 / 3, -1 / 3, 0.0])
    empty = sft_loss(_t([-0.3], grad=True), _t([0.0]))
    assert empty.item() == 0.0
    with pytest.raises(ValueError, match="shape"):
        sft_loss(_t([-0.3, -0.2]), _t([1.0]))


# ---------------------------------------------------------------- ppo_clip_loss
def test_ppo_on_policy_value_and_gradient():
    # logp == old -> rho = 1 everywhere; mask keeps tokens 0, 1 (N = 2)
    # L = -(1*1 + 1*(-2)) / 2 = 0.5 ; dL/dlogp_k = -rho*A_k/N = [-0.5, +1.0, 0]
    logp = _t([0.0, 0.0, 0.0], grad=True)
    loss = ppo_clip_loss(logp, _t([0.0, 0.0, 0.0]), _t([1.0, -2.0, 3.0]), _t([1.0, 1.0, 0.0]))
    assert loss.item() == approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == approx([-0.5, 1.0, 0.0])


def test_ppo_clipped_and_unclipped_regimes():
    # logp - old = [0.5, 0.5, -0.5, -0.5], A = [1, -1, 1, -1], eps 0.2, N = 4
    # tok0 rho=e^.5=1.64872>1.2, A>0: min(1.64872, 1.2) = 1.2 (clipped)   -> l = -1.2,     grad 0
    # tok1 rho=1.64872,          A<0: min(-1.64872, -1.2) = -1.64872     -> l = +1.64872, grad -rho*A/N = +1.64872/4
    # tok2 rho=e^-.5=0.60653<0.8, A>0: min(0.60653, 0.8) = 0.60653       -> l = -0.60653, grad -0.60653/4
    # tok3 rho=0.60653,          A<0: min(-0.60653, -0.8) = -0.8 (clipped) -> l = +0.8,   grad 0
    # L = (-1.2 + 1.64872 - 0.60653 + 0.8) / 4 = 0.16055
    e, ie = math.exp(0.5), math.exp(-0.5)
    old = _t([-1.0, -1.0, -1.0, -1.0])
    logp = (old + _t([0.5, 0.5, -0.5, -0.5])).detach().requires_grad_(True)
    loss = ppo_clip_loss(logp, old, _t([1.0, -1.0, 1.0, -1.0]), torch.ones(4), clip_eps=0.2)
    assert loss.item() == approx((-1.2 + e - ie + 0.8) / 4)
    assert loss.item() == approx(0.1605475)
    loss.backward()
    assert logp.grad.tolist() == approx([0.0, e / 4, -ie / 4, 0.0])


def test_ppo_inside_clip_range_is_unclipped():
    # rho = e^0.1 = 1.10517 in [0.8, 1.2]: both terms equal, L = -rho*A, grad = -rho*A
    logp = _t([0.1], grad=True)
    loss = ppo_clip_loss(logp, _t([0.0]), _t([2.0]), _t([1.0]))
    assert loss.item() == approx(-2 * math.exp(0.1))
    loss.backward()
    assert logp.grad.tolist() == approx([-2 * math.exp(0.1)])


def test_ppo_empty_mask_broadcast_and_padding():
    logp = _t([[0.3, float("nan")], [0.1, -float("inf")]], grad=True)
    old = _t([[0.0, float("nan")], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [True, False]])
    # adv per sequence [B, 1] broadcast to tokens; NaN/inf outside the mask never leak
    loss = ppo_clip_loss(logp, old, _t([[1.0], [-1.0]]), mask)
    # tok (0,0): rho = e^.3 = 1.34986 > 1.2, A = 1 -> l = -1.2 ; tok (1,0): rho = e^.1 = 1.10517, A = -1 -> l = +1.10517
    assert loss.item() == approx((-1.2 + math.exp(0.1)) / 2)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad.flatten().tolist() == approx([0.0, 0.0, math.exp(0.1) / 2, 0.0])
    # empty mask: 0, and backward still works
    logp2 = _t([0.5, -0.2], grad=True)
    loss = ppo_clip_loss(logp2, _t([0.0, 0.0]), _t([1.0, 1.0]), torch.zeros(2))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert logp2.grad.tolist() == [0.0, 0.0]


def test_ppo_validation_and_bf16():
    with pytest.raises(ValueError, match="old_logp"):
        ppo_clip_loss(torch.zeros(3), torch.zeros(2), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="clip_eps"):
        ppo_clip_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3), clip_eps=-0.1)
    logp = torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)
    loss = ppo_clip_loss(logp, torch.zeros(3, dtype=torch.bfloat16), torch.ones(3), torch.ones(3))
    assert loss.dtype == torch.float32 and loss.item() == approx(-1.0)
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16


# ---------------------------------------------------------------- csd_loss
def test_csd_value_and_gradient_is_minus_g_over_n():
    # s = [-1, -2, -0.5], t = [-0.5, -2.5, -0.5], mask [1, 1, 0] (N = 2), beta 5
    # delta = t - s = [0.5, -0.5] -> g = sigmoid(2.5) = 0.92414, sigmoid(-2.5) = 0.07586
    # L = (0.92414*0.5 + 0.07586*(-0.5)) / 2 = 0.21207
    # dL/ds = -g/N = [-0.46207, -0.03793, 0] ; the teacher gets no gradient
    s = _t([-1.0, -2.0, -0.5], grad=True)
    t = _t([-0.5, -2.5, -0.5], grad=True)
    loss = csd_loss(s, t, _t([1.0, 1.0, 0.0]), beta=5.0)
    g1, g2 = sig(2.5), sig(-2.5)
    assert loss.item() == approx((g1 * 0.5 - g2 * 0.5) / 2)
    assert loss.item() == approx(0.2120711)
    loss.backward()
    assert s.grad.tolist() == approx([-g1 / 2, -g2 / 2, 0.0])
    assert t.grad is None


def test_csd_gradient_matches_autograd_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    s = (-torch.rand(4, 7, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    t = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 3
    mask = torch.rand(4, 7, generator=gen) > 0.4
    n = int(mask.sum())
    loss = csd_loss(s, t, mask, beta=5.0)
    (grad,) = torch.autograd.grad(loss, s)
    g = torch.sigmoid(5.0 * (t - s.detach()))
    expected = torch.where(mask, -g / n, torch.zeros_like(g))
    torch.testing.assert_close(grad, expected)
    assert (grad <= 0).all()  # it only ever raises the log-probs of coached tokens
    assert loss.item() == approx(float((g * (t - s.detach()))[mask].sum() / n))


def test_csd_placebo_only_where_not_nan():
    # as above, placebo p = [nan, -3.0, -1.0(masked out)]
    # tok0: no placebo -> delta = t - s = 0.5 ; tok1: delta = t - p = -2.5 + 3 = 0.5
    # g = sigmoid(2.5) for both ; the target stays t:
    # L = (0.92414*(-0.5 + 1) + 0.92414*(-2.5 + 2)) / 2 = 0 ; grad = [-0.46207, -0.46207, 0]
    s = _t([-1.0, -2.0, -0.5], grad=True)
    p = _t([float("nan"), -3.0, -1.0], grad=True)
    loss = csd_loss(s, _t([-0.5, -2.5, -0.5]), _t([1.0, 1.0, 0.0]), beta=5.0, placebo_logp=p)
    g = sig(2.5)
    assert loss.item() == approx(0.0)
    loss.backward()
    assert s.grad.tolist() == approx([-g / 2, -g / 2, 0.0])
    assert p.grad is None
    # an all-NaN placebo is the same as none
    s2 = _t([-1.0, -2.0, -0.5], grad=True)
    nan = _t([float("nan")] * 3)
    csd_loss(s2, _t([-0.5, -2.5, -0.5]), _t([1.0, 1.0, 0.0]), placebo_logp=nan).backward()
    assert s2.grad.tolist() == approx([-sig(2.5) / 2, -sig(-2.5) / 2, 0.0])


def test_csd_beta_effect():
    # delta = [+0.5, -0.5] ; beta 0 -> g = 1/2 everywhere -> grad -0.25 each (N = 2)
    # larger beta sharpens the gate: g(+) rises towards 1, g(-) falls towards 0
    def grads(beta):
        s = _t([-1.0, -2.0], grad=True)
        csd_loss(s, _t([-0.5, -2.5]), torch.ones(2), beta=beta).backward()
        return [-2 * x for x in s.grad.tolist()]  # = g

    assert grads(0.0) == approx([0.5, 0.5])
    g1, g5, g20 = grads(1.0), grads(5.0), grads(20.0)
    assert g1 == approx([sig(0.5), sig(-0.5)]) and g5 == approx([sig(2.5), sig(-2.5)])
    assert g1[0] < g5[0] < g20[0] < 1 and g1[1] > g5[1] > g20[1] > 0
    with pytest.raises(ValueError, match="beta"):
        csd_loss(_t([0.0]), _t([0.0]), torch.ones(1), beta=-1.0)


def test_csd_empty_mask_and_padding():
    s = _t([-1.0, float("nan")], grad=True)
    loss = csd_loss(s, _t([float("nan"), float("-inf")]), torch.zeros(2))
    assert loss.item() == 0.0
    loss.backward()
    assert s.grad.tolist() == [0.0, 0.0]
    # NaN teacher/student at masked-out (padding) positions do not leak
    s = _t([-1.0, float("nan")], grad=True)
    loss = csd_loss(s, _t([-0.5, float("nan")]), _t([1.0, 0.0]))
    assert loss.item() == approx(sig(2.5) * 0.5)
    loss.backward()
    assert s.grad.tolist() == approx([-sig(2.5), 0.0])
    with pytest.raises(ValueError, match="placebo_logp"):
        csd_loss(_t([0.0, 0.0]), _t([0.0, 0.0]), torch.ones(2), placebo_logp=_t([0.0]))


def test_csd_gradient_nonzero_when_grpo_advantages_are_zero():
    # SPEC §3.4: with all GRPO advantages 0 the PPO gradient vanishes, CSD's does not
    logp = _t([-1.0, -2.0], grad=True)
    total = ppo_clip_loss(logp, logp.detach(), torch.zeros(2), torch.ones(2)) + 0.01 * csd_loss(
        logp, _t([-0.5, -1.0]), torch.ones(2))
    total.backward()
    assert (logp.grad < 0).all()


def test_csd_weighted_likelihood_optimum():
    # SPEC §3.4: over actions a ~ p (fixed sampler, enumerated exactly), minimising the expected CSD
    # loss with a fixed coaching weight g(a) (placebo-corrected delta, independent of the student)
    # drives the student to p+(a) ∝ p(a) g(a).
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    teacher = _t([-1.0, -1.0, -1.0])
    placebo = torch.tensor([-1.0 + 0.277259, -1.0, -1.0 - 0.439445], dtype=torch.float64)  # g = 0.2, 0.5, 0.9
    g = torch.sigmoid(5.0 * (teacher - placebo))
    theta = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=2.0)
    for _ in range(3000):
        logq = torch.log_softmax(theta, 0)
        loss = sum(p[a] * csd_loss(logq[a:a + 1], teacher[a:a + 1], torch.ones(1), placebo_logp=placebo[a:a + 1])
                   for a in range(3))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert g.tolist() == pytest.approx([0.2, 0.5, 0.9], abs=1e-6)
    target = p * g / (p * g).sum()
    assert torch.softmax(theta, 0).tolist() == pytest.approx(target.tolist(), abs=1e-6)
    assert target[2] > p[2] and target[0] < p[0]      # coaching moves mass to the well-coached action
