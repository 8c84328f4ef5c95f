"""``describe``: what the engine ranks compute in reaches the trainer ranks, whose own
engine is a description on the meta device (no real FP8 backend, no GPU KV kernel: on a
GPU it would say "fp8 (emulated)" and "fp8_e4m3 (emulated)" where the engine ranks run
the real ones). One process: the request channel and the results group replaced by a
loopback, so the server's reply is what the trainer side reads."""

from types import SimpleNamespace

from quantroll.distributed import engine_ranks


class _Loopback:
    """broadcast_text over a group of one: the sender's text is what every reader gets."""

    def __init__(self):
        self.said = None

    def __call__(self, ctx, text, src=0):
        if text is not None:
            self.said = text
        return self.said


def test_the_trainer_ranks_see_the_engine_ranks_precision_and_kv_cache_label(monkeypatch):
    wire = _Loopback()
    monkeypatch.setattr(engine_ranks, "broadcast_text", wire)
    groups = SimpleNamespace(results=None, broadcast=None, first_engine=1, world=SimpleNamespace(rank=1))
    serving = SimpleNamespace(precision="fp8", kv_cache_label="fp8_e4m3")  # the engine rank's, on its GPU
    server = engine_ranks.EngineServer.__new__(engine_ranks.EngineServer)
    server.engine, server.groups = serving, groups
    server._describe()
    description = SimpleNamespace(precision="fp8 (emulated)", kv_cache_label="fp8_e4m3 (emulated)")  # on meta
    seen = engine_ranks.describe_engines(description, groups, engine_ranks.EngineRequests(groups))
    assert (seen.precision, seen.kv_cache_label) == ("fp8", "fp8_e4m3")
