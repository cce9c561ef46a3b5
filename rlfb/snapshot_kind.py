"""What a saved learner state says about the ensemble that wrote it.

Two apps can share one feedback store with other policies, retrievers, chunk explorations, dense
models (of another dimension, or named by another cache key) or hyperparameters. A snapshot of another
kind must not be loaded (its state has another shape, or its memory another model's embeddings) nor
imported silently over one's own. The ensemble (which snapshots are its own), ``rlfb
weights import`` (which notes to give) and the store's ``prune`` (which snapshot of each kind to
keep, in SQL over the same fields) read them alike through :class:`SnapshotKind`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlfb.policies.base import _by_value, same_hyperparameters


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class SnapshotKind:
    """The kind of ensemble a snapshot (or a learner) belongs to; ``None`` where it does not say.

    Older snapshots name neither policy nor retrievers, and a user's own policy may have no
    hyperparameters: a field one side leaves ``None`` is no difference.

    >>> saved = {"policy": "thompson", "state": {"retrievers": ["bm25", "dense"],
    ...          "exploration": {"kind": "none"}, "policy": {"name": "thompson", "params": {"step": 0.1}}}}
    >>> kind = SnapshotKind.of(saved)
    >>> kind.policy, kind.retrievers, kind.exploration
    ('thompson', ('bm25', 'dense'), 'none')
    >>> kind.differences(SnapshotKind(policy="thompson", exploration="thompson", params={"step": 0.5}))
    {'exploration': ('none', 'thompson'), 'params': ({'step': 0.1}, {'step': 0.5})}
    """

    policy: str | None = None
    retrievers: tuple[str, ...] | None = None
    exploration: str | None = None
    dim: int | None = None  # the feedback memory's query-embedding dimension: the dense model's
    model: str | None = None  # the dense model the memory's embeddings are of (its cache key), where saved
    params: Mapping[str, Any] | None = None  # the policy's hyperparameters (its weights are left out)

    @classmethod
    def of(cls, saved: Mapping[str, Any] | None) -> SnapshotKind:
        """Read a store snapshot (``{"policy": ..., "state": ...}``, as ``load_policy_state`` returns)."""
        state = _field(saved, "state")
        pstate = _field(state, "policy")
        # the snapshot's policy column; an older snapshot has none, and its state names the policy
        policy = _field(saved, "policy") or _field(pstate, "name")
        retrievers = _field(state, "retrievers")
        kind = _field(_field(state, "exploration"), "kind")
        dim = _field(_field(state, "memory"), "dim")
        model = _field(_field(state, "memory"), "model")
        params = _field(pstate, "params")
        return cls(
            policy=policy if isinstance(policy, str) else None,
            retrievers=tuple(retrievers) if isinstance(retrievers, list) else None,
            exploration=kind if isinstance(kind, str) else None,
            dim=dim if isinstance(dim, int) else None,
            model=model if isinstance(model, str) else None,
            params=params if isinstance(params, Mapping) else None,
        )

    @classmethod
    def of_learner(cls, learner: Any, dim: int | None = None, model: str | None = None) -> SnapshotKind:
        """The kind a :class:`~rlfb.learner.Learner` writes (``dim`` and ``model``: its ensemble's query dimension
        and dense model)."""
        params = getattr(learner.policy, "params", None)  # a user's own policy may have none
        return cls(policy=learner.policy_name, retrievers=tuple(learner.retrievers),
                   exploration=learner.config.chunk_exploration, dim=dim, model=model,
                   params=params() if callable(params) else None)

    def key(self) -> str:
        """The kind as one string, which the store keeps with each snapshot: equal for two snapshots of one kind
        (hyperparameters compared by value, the weights left out, as :meth:`differences` compares them).

        Stricter than :meth:`differences`: a field one side leaves ``None``, or a hyperparameter only one side
        has, makes another key, so a save never counts another kind's snapshot as its own.

        >>> a = SnapshotKind(policy="thompson", params={"step": 0.1, "window": 100, "weights": {"bm25": 1.0}})
        >>> a.key() == SnapshotKind(policy="thompson", params={"window": 100.0, "step": 0.1}).key()
        True
        >>> a.key() == SnapshotKind(policy="thompson", params={"step": 0.2, "window": 100}).key()
        False
        """
        params = None if self.params is None else _by_value({k: v for k, v in self.params.items() if k != "weights"})
        fields = [self.policy, None if self.retrievers is None else list(self.retrievers), self.exploration,
                  self.dim, self.model, params]
        return json.dumps(fields, sort_keys=True, default=str)

    @classmethod
    def from_key(cls, key: Any) -> SnapshotKind | None:
        """The kind :meth:`key` wrote, or ``None`` for a key of no kind (the store's key of a snapshot it could
        not read, one per snapshot).

        >>> kind = SnapshotKind(policy="thompson", retrievers=("bm25",), params={"step": 0.1})
        >>> SnapshotKind.from_key(kind.key()) == kind, SnapshotKind.from_key('["unreadable snapshot", 7]')
        (True, None)
        """
        try:
            fields = json.loads(key)
            policy, retrievers, exploration, dim, model, params = fields
        except (TypeError, ValueError):
            return None
        return cls.of({"policy": policy, "state": {
            "retrievers": retrievers, "exploration": {"kind": exploration},
            "memory": {"dim": dim, "model": model}, "policy": {"params": params}}})

    def differences(self, other: SnapshotKind) -> dict[str, tuple[Any, Any]]:
        """``{field: (this, other)}`` for each field both name and disagree on (hyperparameters as
        :func:`~rlfb.policies.base.same_hyperparameters` compares them)."""
        out: dict[str, tuple[Any, Any]] = {}
        for name in ("policy", "retrievers", "exploration", "dim", "model"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                out[name] = (mine, theirs)
        if self.params is not None and other.params is not None \
                and not same_hyperparameters(self.params, other.params):
            out["params"] = (self.params, other.params)
        return out
