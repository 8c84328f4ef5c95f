"""SFT at long context: any model shape and context, token-sized batches with gradient
accumulation and length bucketing, resume from a kill, and a stop rule on sampled quality
(per-token NLL and the engine's sampled pass rate per length bucket). ``quantroll sft
--tokens-per-batch N`` runs it; without that flag ``sft`` keeps the shipped models' recipe
(quantroll/sft.py)."""
