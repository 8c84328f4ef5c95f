"""The engine's process of tests/sync/test_shared_weights.py (started with spawn)."""

from __future__ import annotations


def engine_side(engine_dir: str, device: str, conn, out: str) -> None:
    """Load every update the trainer publishes, then write the engine's state to ``out``."""
    from safetensors.torch import save_file

    from quantroll.engine import Engine
    from quantroll.sync.shared import SharedWeightsReceiver

    engine = Engine(engine_dir, device=device)
    try:
        receiver = SharedWeightsReceiver(engine, conn)
    except Exception:  # noqa: BLE001 - the trainer got the error as the answer
        return
    receiver.serve()
    save_file({k: v.detach().contiguous().cpu() for k, v in engine.state().items()}, out)
