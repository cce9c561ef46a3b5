"""PDGD's debiasing weights use the temperature the shown ranking was sampled with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlfb.fusion import score_scale
from rlfb.policies import GradientPolicy
from rlfb.policies.base import Context, Decision, Episode
from rlfb.policies.gradient import pdgd_debias_weights, pdgd_pairs, plackett_luce_log_prob

RETRIEVERS = ("bm25", "dense", "splade")


def _context(seed: int = 0, n: int = 12, k: int = 6) -> Context:
    rng = np.random.default_rng(seed)
    N = rng.uniform(0.0, 1.0, size=(n, len(RETRIEVERS)))
    ids = tuple(f"c{i}" for i in range(n))
    return Context("q", RETRIEVERS, ids, N.copy(), N, k=k)


def _episode(ctx: Context, decision: Decision, rewards: np.ndarray) -> Episode:
    order = np.asarray(decision.ranking)
    return Episode(
        event_id="e",
        query="q",
        retrievers=RETRIEVERS,
        decision=decision,
        shown_ids=tuple(ctx.candidate_ids[i] for i in order),
        shown=ctx.normalized[order],
        chunk_rewards=rewards,
        reward=1.0,
    )


def _expected_gradient(p: GradientPolicy, ep: Episode, w_now: np.ndarray, tau_rho: float) -> np.ndarray:
    """PDGD's gradient for one episode, with rho at ``tau_rho`` (the model at the policy's own temperature)."""
    X = ep.shown
    r = np.asarray(ep.chunk_rewards)
    pos, neg = pdgd_pairs(r)
    scale = score_scale(X)
    w_log = np.array([ep.decision.weights[n] for n in RETRIEVERS])
    rho = pdgd_debias_weights(X @ w_log / tau_rho, pos, neg)
    f = X @ w_now / (p.hyper.temperature * scale)
    d = f[pos][:, None] - f[neg][None, :]
    pw = rho * (1 / (1 + np.exp(-d))) * (1 / (1 + np.exp(d))) * np.minimum(r[pos], 1.0)[:, None]
    diff = X[pos][:, None, :] - X[neg][None, :, :]
    return np.einsum("ij,ijk->k", pw, diff) / scale


def _clicked(k: int) -> np.ndarray:
    r = np.zeros(k)
    r[3] = 1.0  # a click at the fourth place: pairs with the three above and the one below
    return r


@pytest.mark.parametrize("multiplier", [0.5, 2.5])
def test_rho_uses_the_temperature_the_ranking_was_sampled_with(multiplier):
    ctx = _context()
    p = GradientPolicy(RETRIEVERS, seed=3).tune(exploration=multiplier)
    w0 = p._w.copy()
    d = p.decide(ctx)
    tau = p.hyper.temperature * score_scale(ctx.normalized) * multiplier
    assert d.sampling_temperature == pytest.approx(tau)
    # the propensity is that of the same distribution
    u = ctx.normalized @ w0 / tau
    assert d.propensity == pytest.approx(math.exp(plackett_luce_log_prob(u, np.array(d.ranking))))
    ep = _episode(ctx, d, _clicked(ctx.k))
    # the guardrail moves before the feedback arrives: the decision's temperature still holds
    p.tune(exploration=1.0)
    p.learn(ep, 1.0)
    # one episode from fresh sums: the running sum of gradients is this episode's gradient
    want = _expected_gradient(p, ep, w0, tau)
    np.testing.assert_allclose(p._s1, want, rtol=1e-10, atol=1e-15)
    # and it is not the gradient with rho at multiplier 1 (what learn computed before)
    stale = _expected_gradient(p, ep, w0, p.hyper.temperature * score_scale(ep.shown))
    assert not np.allclose(want, stale, rtol=1e-3, atol=0.0)


def test_rho_is_computed_at_the_sampling_temperature(monkeypatch):
    """The scores learn() hands to pdgd_debias_weights are the logged weights' scores over that temperature."""
    import rlfb.policies.gradient as gradient

    seen = []

    def spy(scores, pos, neg):
        seen.append(np.array(scores))
        return pdgd_debias_weights(scores, pos, neg)

    monkeypatch.setattr(gradient, "pdgd_debias_weights", spy)
    ctx = _context(seed=1)
    p = GradientPolicy(RETRIEVERS, seed=0).tune(exploration=3.0)
    d = p.decide(ctx)
    ep = _episode(ctx, d, _clicked(ctx.k))
    p.learn(ep, 1.0)
    tau = p.hyper.temperature * score_scale(ctx.normalized) * 3.0
    w_log = np.array([d.weights[n] for n in RETRIEVERS])
    np.testing.assert_allclose(seen[0], ep.shown @ w_log / tau)


def test_a_decision_logged_without_its_temperature_learns_at_multiplier_one(monkeypatch):
    import rlfb.policies.gradient as gradient

    seen = []

    def spy(scores, pos, neg):
        seen.append(np.array(scores))
        return pdgd_debias_weights(scores, pos, neg)

    monkeypatch.setattr(gradient, "pdgd_debias_weights", spy)
    ctx = _context(seed=2)
    p = GradientPolicy(RETRIEVERS, seed=0).tune(exploration=2.0)
    d = p.decide(ctx)
    old = Decision(d.weights, propensity=d.propensity, explored=d.explored, policy=d.policy, ranking=d.ranking)
    assert old.sampling_temperature is None and "sampling_temperature" not in old.to_dict()
    ep = _episode(ctx, old, _clicked(ctx.k))
    p.learn(ep, 1.0)
    w_log = np.array([d.weights[n] for n in RETRIEVERS])
    np.testing.assert_allclose(seen[0], ep.shown @ w_log / (p.hyper.temperature * score_scale(ep.shown)))
    assert np.all(np.isfinite(p._w)) and p.n_updates == 1.0


def test_the_sampling_temperature_is_logged_with_the_decision():
    ctx = _context()
    p = GradientPolicy(RETRIEVERS, seed=0).tune(exploration=1.5)
    d = p.decide(ctx)
    assert d.to_dict()["sampling_temperature"] == pytest.approx(d.sampling_temperature)
    # a greedy decision samples nothing and logs as before
    g = p.decide(ctx, explore=False)
    assert g.sampling_temperature is None
    assert set(g.to_dict()) == {"weights", "arm", "propensity", "explored", "policy"}


def test_the_sampling_temperature_survives_the_store(tmp_path):
    from rlfb import FeedbackEnsemble
    from rlfb.store import FeedbackStore

    texts = [f"chunk {i} about tides moon aurora volcano {'x' * i}" for i in range(12)]
    ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), policy="gradient", store=tmp_path / "fb.db")
    ens.learner.policy._explore_scale = 2.0  # as the guardrail sets it when learned weights do worse
    res = ens.retrieve("tides and the moon", k=5, explore=True)
    assert res.event_id is not None
    logged = ens.store.event(res.event_id)["decision"]["sampling_temperature"]
    assert logged > 0 and math.isfinite(logged)
    record = ens.feedback(res.event_id, "click", chunk_id=res.hits[2].chunk_id)
    ep = ens.episode(res.event_id, record)  # what the policy learns from, rebuilt from the store's rows
    assert ep.decision.sampling_temperature == pytest.approx(logged)
    greedy = ens.retrieve("tides and the moon", k=5, explore=False)
    assert "sampling_temperature" not in ens.store.event(greedy.event_id)["decision"]
    ens.close()
    with FeedbackStore(tmp_path / "fb.db") as again:  # reopened: the migration is safe to rerun
        assert again.event(res.event_id)["decision"]["sampling_temperature"] == pytest.approx(logged)
    with pytest.raises(Exception, match="sampling_temperature"):
        FeedbackStore(tmp_path / "fb.db").log_event("q", {"weights": {"bm25": 1.0}, "sampling_temperature": -1.0},
                                                    chunks=[{"chunk_id": "c0", "score": 1.0}])


def test_the_sampling_temperature_is_exported(tmp_path):
    from rlfb import FeedbackEnsemble

    texts = [f"chunk {i} about tides moon aurora volcano {'x' * i}" for i in range(12)]
    with FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), policy="gradient", store=tmp_path / "fb.db") as ens:
        sampled = ens.retrieve("tides and the moon", k=5, explore=True).event_id
        greedy = ens.retrieve("tides and the moon", k=5, explore=False).event_id
        rows = {r["event_id"]: r for r in ens.store.export_rows()}
        logged = ens.store.event(sampled)["decision"]["sampling_temperature"]
        assert rows[sampled]["sampling_temperature"] == pytest.approx(logged)
        assert rows[greedy]["sampling_temperature"] is None
        assert "sampling_temperature" in ens.store.to_dataframe().columns


def test_the_debiasing_weight_reads_the_logged_weights() -> None:
    # rho must come from the ranking the user saw (the logging weights), not the current ones: a click on a
    # chunk the logger ranked first is partly explained by its place, so two loggers teach different steps
    X = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    clicks = np.array([0.0, 1.0, 0.0])

    def final(logged: list[float]) -> np.ndarray:
        policy = GradientPolicy(["a", "b"], evidence_z=0.0, seed=0)
        for i in range(5):
            policy.learn(Episode(f"e{i}", "q", ("a", "b"), Decision(dict(zip("ab", logged, strict=True))),
                                 ("c1", "c2", "c3"), X, clicks, 1.0), 1.0)
        return np.array(list(policy.weights().values()))

    assert not np.allclose(final([0.95, 0.05]), final([0.05, 0.95]))


def test_the_learning_rate_decays_as_one_over_the_root_of_the_updates() -> None:
    # learning_rate / sqrt(1 + t / lr_decay): at t = 3 lr_decay, half the rate (1 / (1 + t / d) gave a quarter)
    policy = GradientPolicy(["a", "b"], seed=0)
    no_preference = Episode("e", "q", ("a", "b"), Decision({"a": 0.5, "b": 0.5}), ("c1", "c2"),
                            np.eye(2), np.zeros(2), 0.0)
    policy.learn(no_preference, 0.0, weight=3 * policy.hyper.lr_decay)  # counted, nothing to learn from
    assert policy._lr() == pytest.approx(policy.hyper.learning_rate / 2)
