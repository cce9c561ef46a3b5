"""What rlfb's learning entry points default to, in one place.

The LangChain and LlamaIndex adapters, ``rlfb simulate`` and ``rlfb demo`` read these: two
adapters that disagreed (fixed weights against a learner, three retrievers against two) could
not share a store's learned weights. :class:`rlfb.FeedbackEnsemble` itself keeps the weights it is
given (``policy="fixed"``) unless a policy is named.
"""

from __future__ import annotations

__all__ = ["LEARNING_POLICY", "ADAPTER_RETRIEVERS"]

#: The policy whose weights the README's results see moving.
LEARNING_POLICY = "thompson"

#: The adapters' own retrievers: what ``rlfb[langchain,dense]`` and ``rlfb[llamaindex,dense]`` install.
ADAPTER_RETRIEVERS = ("bm25", "dense")
