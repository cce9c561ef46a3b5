"""rlfb: reinforcement learning from feedback for the retrieval layer of LLM apps."""
