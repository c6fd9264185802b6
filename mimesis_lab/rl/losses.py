"""Token-level policy losses: PPO clip (GRPO, SPEC §3.2) and CSD ``sdar`` (SPEC §3.3 items 5–7).

Tensors in, a scalar tensor out; no I/O. Conventions shared by both losses:

- ``mask`` selects the tokens the loss averages over (non-zero / ``True`` = selected); the
  loss is the **token mean** over the selected tokens, ``sum_k mask_k * l_k / N`` with
  ``N = sum_k mask_k`` (over the whole batch, not per sequence).
- Positions outside the mask never influence the value or the gradient, even when they hold
  ``nan``/``inf`` (padding): the inputs are replaced by neutral values there *before* any
  arithmetic, so no ``0 * nan`` reaches the forward or backward pass.
- An empty mask gives a loss of exactly 0 that is still connected to the graph (``backward``
  works and yields zero gradients).
- Arithmetic runs in at least float32 (bf16 inputs are upcast); the gradient flows back to
  the input dtype.
"""
from __future__ import annotations

import math

import torch

__all__ = ["ppo_clip_loss", "kl_penalty", "sft_loss", "csd_loss", "csd_gate"]


def _check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {ref_name}'s {tuple(ref.shape)}")


def _finite_non_negative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    if not t.is_floating_point():
        raise ValueError(f"log-probabilities must be a floating tensor, got {t.dtype}")
    return torch.promote_types(t.dtype, torch.float32)


def _token_mean(values: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """``sum(values[sel]) / max(N, 1)``; ``values`` is already zero (and finite) outside ``sel``."""
    n = sel.sum().clamp_min(1).to(values.dtype)
    return values.sum() / n


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> torch.Tensor:
    """Token-level PPO clipped policy loss (SPEC §3.2)::

        rho_k = exp(logp_k - old_logp_k) = pi_theta(y_k | H, y_<k) / pi_old(y_k | H, y_<k)
        L     = -(1/N) * sum_{k in mask} min( rho_k * A_k, clip(rho_k, 1 - eps, 1 + eps) * A_k )

    Only agent-generated tokens belong in ``mask``: user utterances and tool outputs are
    context, never predicted.

    Gradient w.r.t. ``logp_k`` on a masked token: ``-rho_k * A_k / N`` when the unclipped term
    is the minimum (always for ``1-eps <= rho <= 1+eps``; also for ``rho > 1+eps`` with ``A < 0``
    and ``rho < 1-eps`` with ``A > 0``), and 0 where the clipped term is the minimum.
    ``old_logp`` and ``adv`` are treated as constants (detached).

    Args:
        logp: current-policy token log-probs (carries the gradient).
        old_logp: behaviour-policy token log-probs, same shape.
        adv: token advantages, broadcastable to ``logp``'s shape (e.g. ``[B, 1]`` per sequence).
        mask: same shape as ``logp``; non-zero = token counted.
        clip_eps: ``eps`` of the clip range, ``>= 0``.
    """
    _check_same_shape("logp", logp, old_logp=old_logp, mask=mask)
    clip_eps = _finite_non_negative("clip_eps", clip_eps)
    dtype = _compute_dtype(logp)
    sel = mask != 0
    adv = torch.broadcast_to(torch.as_tensor(adv, device=logp.device).detach(), logp.shape).to(dtype)

    lp = torch.where(sel, logp.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    old = torch.where(sel, old_logp.detach().to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    a = torch.where(sel, adv, torch.zeros((), dtype=dtype, device=logp.device))

    ratio = torch.exp(lp - old)  # 1 outside the mask
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
    per_token = -torch.minimum(unclipped, clipped)  # 0 outside the mask (a = 0 there)
    return _token_mean(per_token, sel)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL penalty to a frozen reference policy, the non-negative low-variance ``k3`` estimator
    (Schulman 2020; verl's ``low_var_kl``, TRL's GRPO ``beta`` term) on the sampled tokens::

        d_k  = sg(ref_logp_k) - logp_k            = log pi_ref(y_k | .) - log pi_theta(y_k | .)
        L_KL = (1/N) * sum_{k in mask} ( exp(d_k) - d_k - 1 )

    ``E_{y ~ pi_theta}[exp(d) - d - 1] = KL(pi_theta || pi_ref)``; each term is ``>= 0`` and 0 exactly where
    the two log-probs agree. ``dL_KL / dlogp_k = (1 - exp(d_k)) / N``: descending pulls ``logp_k`` toward
    ``ref_logp_k`` from either side. Not in the paper's recipes (SPEC §2.3: "no KL"); a recipe adds it as
    ``L = L_PPO + kl_coef * L_KL`` (``kl_coef`` 0 = the paper). ``d_k`` is clamped to ``[-20, 20]`` so a
    token the reference finds impossible cannot overflow ``exp``.

    Args:
        logp: current-policy token log-probs (carries the gradient).
        ref_logp: the reference policy's log-probs of the same tokens, same shape (detached here).
        mask: same shape; non-zero = token counted.
    """
    _check_same_shape("logp", logp, ref_logp=ref_logp, mask=mask)
    dtype = _compute_dtype(logp)
    sel = mask != 0
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    lp = torch.where(sel, logp.to(dtype), zero)
    ref = torch.where(sel, ref_logp.detach().to(dtype), zero)
    d = (ref - lp).clamp(-20.0, 20.0)
    per_token = torch.where(sel, torch.exp(d) - d - 1.0, zero)
    return _token_mean(per_token, sel)


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The replay (ptx) term: the token-mean negative log-likelihood of demonstration tokens::

        L_SFT = -(1/N) * sum_{k in mask} logp_k

    the SFT phases' cross-entropy on the same tokens. A recipe adds it as ``L + ptx_coef * L_SFT``
    (InstructGPT's PPO-ptx; ``ptx_coef`` 0 = the paper). ``dL_SFT / dlogp_k = -1/N``.

    Args:
        logp: policy log-probs of the demonstration's tokens (carries the gradient).
        mask: same shape; non-zero = a trained (assistant) token.
    """
    _check_same_shape("logp", logp, mask=mask)
    dtype = _compute_dtype(logp)
    sel = mask != 0
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    return _token_mean(torch.where(sel, -logp.to(dtype), zero), sel)


def csd_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 5.0,
    placebo_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """CSD self-distillation loss, estimator ``sdar`` with optional placebo correction
    (SPEC §3.3 items 5–7). With ``s`` the student log-prob of a sampled token under the public
    context, ``t`` the (same-actor, no-grad) teacher log-prob of that token under the coached
    context, and ``sg`` stop-gradient::

        delta_k = sg(t_k) - sg(s_k)                      (no placebo for token k)
        delta_k = sg(t_k) - sg(p_k)                      (placebo log-prob p_k available)
        g_k     = sigmoid(beta * delta_k)                (detached, in (0, 1))
        L_CSD   = (1/N) * sum_{k in mask} g_k * (sg(t_k) - s_k)

    so ``dL_CSD / ds_k = -g_k / N`` on masked tokens: descending the loss raises the
    log-prob of coached tokens in proportion to ``g_k``; a negative ``delta`` only shrinks the
    weight, it is never pushed down. No gradient reaches ``teacher_logp`` or ``placebo_logp``.
    The placebo (a teacher row with a different, unrelated note) removes the generic "any note
    helps" effect from the gate only; the distillation target stays ``t``. The total loss is
    ``L = L_GRPO + alpha * L_CSD`` (alpha = 0.01; not applied here).

    Args:
        student_logp: student token log-probs (carries the gradient).
        teacher_logp: teacher token log-probs, same shape (detached here).
        mask: same shape; non-zero = coached token (the ``sdpo_mask``).
        beta: gate sharpness, finite and ``>= 0`` (``beta = 0`` → ``g = 1/2`` everywhere).
        placebo_logp: optional, same shape; ``nan`` where a token has no placebo row.
    """
    dtype = _compute_dtype(student_logp)
    sel = mask != 0
    zero = torch.zeros((), dtype=dtype, device=student_logp.device)
    gate, _ = csd_gate(student_logp, teacher_logp, mask, beta, placebo_logp)
    s = torch.where(sel, student_logp.to(dtype), zero)
    t = torch.where(sel, teacher_logp.detach().to(dtype), zero)
    per_token = torch.where(sel, gate * (t - s), zero)
    return _token_mean(per_token, sel)


def csd_gate(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 5.0,
    placebo_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSD gate and its argument, detached (SPEC §3.3 items 6–7)::

        delta_k = sg(t_k) - sg(p_k)  where a placebo log-prob p_k exists, else sg(t_k) - sg(s_k)
        g_k     = sigmoid(beta * delta_k)

    Returns ``(g, delta)`` on the full grid; outside ``mask`` ``delta`` is 0 (and ``g`` = 1/2), so
    read them through the mask. :func:`csd_loss` weights its tokens by ``g``; a recipe logs
    ``g`` and ``delta`` from here, so the formula exists once.
    """
    _check_same_shape("student_logp", student_logp, teacher_logp=teacher_logp, mask=mask,
                      placebo_logp=placebo_logp)
    beta = _finite_non_negative("beta", beta)
    dtype = _compute_dtype(student_logp)
    sel = mask != 0
    zero = torch.zeros((), dtype=dtype, device=student_logp.device)
    s = torch.where(sel, student_logp.detach().to(dtype), zero)
    t = torch.where(sel, teacher_logp.detach().to(dtype), zero)
    baseline = s
    if placebo_logp is not None:
        p = placebo_logp.detach().to(dtype)
        baseline = torch.where(sel & ~torch.isnan(p), p, baseline)
    delta = t - baseline
    return torch.sigmoid(beta * delta).detach(), delta.detach()
