"""The RL loop: rollout (engine, rollout precision) -> old logprobs (trainer) ->
advantages -> corrections -> loss -> optimizer step -> weight sync -> metrics."""
