"""The retriever's own options are taken by every constructor, and an unknown one is named against the method called.

``observe_followups=False`` was refused by ``from_texts``, ``from_documents`` and ``from_retrievers`` ("FeedbackEnsemble
takes no option 'observe_followups'"): only the plain constructor and ``from_ensemble`` took it, and the error
named a class the caller never called, listing none of the retriever's own options (a README audit, 2026-12-06).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_community.retrievers import BM25Retriever
from langchain_core.documents import Document
from langchain_core.runnables import RunnableConfig

from langchain_rlfb import FeedbackEnsembleRetriever
from rlfb import ValidationError

from _lc_corpus import IDS, TEXTS


def build(how: str, store: Any, **options: Any) -> FeedbackEnsembleRetriever:
    if how == "from_texts":
        return FeedbackEnsembleRetriever.from_texts(TEXTS, IDS, retrievers=("bm25",), store=store, k=2, **options)
    if how == "from_documents":
        docs = [Document(page_content=t, id=i) for t, i in zip(TEXTS, IDS, strict=True)]
        return FeedbackEnsembleRetriever.from_documents(docs, retrievers=("bm25",), store=store, k=2, **options)
    return FeedbackEnsembleRetriever.from_retrievers({"bm25": BM25Retriever.from_texts(TEXTS, ids=IDS, k=4)},
                                                     store=store, k=2, **options)


@pytest.mark.parametrize("how", ["from_texts", "from_documents", "from_retrievers"])
def test_observe_followups_is_taken_by_every_constructor(tmp_path: Any, how: str) -> None:
    def signals(retriever: FeedbackEnsembleRetriever) -> list[str]:
        config: RunnableConfig = {"metadata": {"session_id": "s1"}}
        first = retriever.invoke("what causes the aurora borealis", config=config)
        retriever.invoke("what really causes the aurora borealis lights", config=config)  # restated
        return [f["signal"] for f in retriever.ensemble.store.feedback(first[0].metadata["event_id"])]

    off = build(how, tmp_path / "fb.db", observe_followups=False)
    assert off.observe_followups is False and signals(off) == []
    on = build(how, tmp_path / "other.db")
    assert on.observe_followups is True and signals(on) == ["reformulation"]


@pytest.mark.parametrize("how", ["from_texts", "from_documents", "from_retrievers"])
def test_an_unknown_option_is_named_against_the_method_called(tmp_path: Any, how: str) -> None:
    with pytest.raises(ValidationError, match=rf"FeedbackEnsembleRetriever\.{how} takes no option 'observe_folowups' "
                                              r"\(did you mean 'observe_followups'\?\)") as caught:
        build(how, tmp_path / "fb.db", observe_folowups=False)
    listed = str(caught.value)
    assert "'explore'" in listed and "'candidate_k'" in listed  # the retriever's options and the ensemble's
    with pytest.raises(ValidationError, match="observe_followups must be True or False"):
        build(how, tmp_path / "fb.db", observe_followups="no")


@pytest.mark.parametrize("how", ["from_texts", "from_documents"])
def test_the_indexing_options_still_reach_the_ensemble(tmp_path: Any, how: str) -> None:
    # the first version of the check above took FeedbackEnsemble's constructor's options alone, and refused
    # from_chunks' retriever_options (a dense model's device or path) and show_progress (a review, 2026-12-06)
    retriever = build(how, tmp_path / "fb.db", retriever_options={"bm25": {}}, show_progress=False)
    assert [d.id for d in retriever.invoke("aurora borealis")]
