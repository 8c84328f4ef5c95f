"""Where the train/rollout gap comes from, and which BF16 exceptions close it.

``quantroll attribute`` measures, on a checkpoint and a set of sampled responses, how much
each decoder layer and each module kind (q/k/v, o, gate/up, down, experts, router) adds to
the gap of a rollout precision, ranks them, proposes the smallest set to keep in BF16 that
brings the gap under a target, prints it as flags ``convert``, ``train`` and ``compare``
take, and verifies it through the real path (convert with those flags, sample with the
engine, score with the BF16 trainer).

Data flows one way: units (names -> cells) -> hybrid (a BF16 model with chosen linears in
the rollout format) -> measure (gaps, divergences) -> ablate / propose -> verify -> report.
"""
