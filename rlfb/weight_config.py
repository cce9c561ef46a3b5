"""The weight configuration centre: the current weights and learner state, kept in the feedback store.

Every process that opens the same store file reads the newest snapshot (see
:meth:`rlfb.FeedbackEnsemble.refresh`), so weights exported from one place and
imported into the store reach every running app within its refresh interval.
Imports are validated: NaN, infinite or negative weights, unknown retrievers
and damaged learner states are rejected and nothing is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.fusion import validate_weights

__all__ = ["current_weights", "export_weights", "import_weights"]


def current_weights(store: Any) -> dict[str, Any]:
    """``{"weights", "policy", "version", "updated_at"}`` of the newest snapshot (empty weights if none)."""
    saved = store.load_policy_state()
    if saved is None:
        return {"weights": {}, "policy": None, "version": 0, "updated_at": None}
    return {k: saved.get(k) for k in ("weights", "policy", "version", "updated_at")}


def export_weights(store: Any, path: str | Path, *, with_state: bool = True) -> dict[str, Any]:
    """Write the newest snapshot to a JSON file (the learner state too, unless ``with_state=False``)."""
    saved = store.load_policy_state()
    if saved is None:
        raise ValidationError("the store holds no weights yet: nothing to export")
    out = {k: saved.get(k) for k in ("weights", "policy", "version", "updated_at")}
    if with_state:
        out["state"] = saved.get("state")
    Path(path).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return out


def _read(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorruptStateError(f"cannot read weights from {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise CorruptStateError(f"{path} must hold a JSON object")
    return dict(data)


def import_weights(store: Any, path: str | Path) -> dict[str, Any]:
    """Validate a weights file and append it to the store as the newest snapshot.

    The file is either an export (``{"weights": ..., "state": ...}``) or just
    ``{"weights": {"bm25": 0.3, ...}}`` / a bare ``{"bm25": 0.3, ...}``. With a
    learner state, the state must load; with weights only, they are applied to
    the newest state in the store (or become a ``fixed`` policy's weights).
    """
    from rlfb.learner import Learner

    data = _read(path)
    raw = data.get("weights", data if "state" not in data else None)
    if not isinstance(raw, Mapping) or not raw:
        raise ValidationError(f"{path}: no weights mapping found")
    try:
        weights = {str(k): float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise ValidationError(f"{path}: weights must be numbers, got {dict(raw)!r}") from None
    names = list(weights)
    normalised = dict(zip(names, validate_weights(weights, names).tolist(), strict=True))
    state = data.get("state")
    if state is not None:
        learner = Learner.from_state_dict(state)  # CorruptStateError on damage
    else:
        saved = store.load_policy_state()
        if saved and saved.get("state"):
            learner = Learner.from_state_dict(saved["state"])
        else:  # an empty store: the weights become a fixed policy's
            learner = Learner(tuple(names), policy="fixed")
    if set(learner.retrievers) != set(names):
        raise ValidationError(f"{path}: weights name {sorted(names)} but the state is for {list(learner.retrievers)}")
    learner.set_weights({n: normalised[n] for n in learner.retrievers})
    version = store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name,
                                      timestamp=time.time())
    return {"weights": learner.weights(), "policy": learner.policy_name, "version": version}
