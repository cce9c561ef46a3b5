from rlfb import FeedbackEnsemble

texts = ["The aurora is caused by charged particles from the sun hitting the atmosphere.",
         "Tides are caused by the gravity of the moon.",
         "Volcanoes erupt when magma rises through the crust."]
ens = FeedbackEnsemble.from_texts(texts, retrievers=("bm25", "dense", "splade"),
                                  store="feedback.db", policy="thompson")
result = ens.retrieve("what causes aurora", k=2, session_id="s1")
for hit in result.hits:   # rank, fused score, each retriever's raw and normalised score, who proposed it
    print(hit.rank, hit.chunk_id, round(hit.score, 3), hit.scores, hit.normalized, hit.proposed_by)

ens.feedback(result.event_id, "explicit_positive")                    # or rating=4, or value=-1.0
ens.feedback(result.event_id, "implicit_positive", chunk_id=result.hits[0].chunk_id)   # a click or citation
ens.observe(session_id="s1", query="what causes the aurora borealis", dwell_seconds=5)  # a reformulation
print(ens.weights)        # {'bm25': ..., 'dense': ..., 'splade': ...}
ens.set_weights({"bm25": 0.2, "dense": 0.5, "splade": 0.3})   # the policy's default, written to the store
