"""Engines on ranks of their own (``--rollout-num-gpus R`` without ``--colocate``): the
trainer ranks ask, the engine ranks serve.

Trainer rank 0 sends each request over the broadcast group (itself and the engine
ranks, quantroll/distributed/groups.py) as one JSON line; the engine ranks run a loop that
takes the next request and serves it (``EngineServer``), so they need to know nothing of
the RL loop's order of stages (evaluation, rollout, the first-update check, resume):

    generate  the prompts, sampling parameters and caps; the engine ranks split them
              (DataParallelEngines over the engine group), and the first engine rank
              sends every result, in prompt order, to every rank (``send_results``)
    describe  what the engine ranks compute in (Engine.precision, Engine.kv_cache_label),
              which the trainer ranks' descriptions on the meta device cannot tell
    sync      the units of the weight broadcast (the trainer's parameter names per FSDP2
              unit) and the bucket size: the engine ranks build their receiving side
    update    one weight update (distributed/weight_broadcast.py): trainer rank 0 quantizes and
              broadcasts, the engine ranks load in place
    check     --check-weight-update-equal: every engine rank checks the next update
              against its checkpoint; the outcome is agreed over every rank
    stop      the run is over (with the error that ended it, if one did)

On a trainer rank ``RemoteEngines`` stands where the engine stood: ``generate`` takes the
whole batch on every trainer rank and returns every result on every trainer rank, as
DataParallelEngines does colocated. A failure an engine rank meets while serving (a
refused request, a check that fails) is said by trainer rank 0, once; the engine ranks
then wait for ``stop``, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

import torch

from quantroll.distributed.collectives import PeerFailed, agree, all_max, broadcast_tensor, broadcast_text
from quantroll.distributed.data_parallel import DataParallelEngines, pack, unpack
from quantroll.distributed.fsdp import ShardUnit
from quantroll.distributed.groups import RankGroups
from quantroll.engine.sampling import SamplingParams
from quantroll.errors import NonFiniteError, QuantrollError


class EngineRequests:
    """The requests channel: trainer rank 0 sends, the engine ranks receive; the other
    trainer ranks take no part (``send`` does nothing there)."""

    def __init__(self, groups: RankGroups):
        self.groups = groups

    def send(self, op: str, **fields) -> None:
        if self.groups.broadcast is not None:
            broadcast_text(self.groups.broadcast, json.dumps({"op": op, **fields}))

    def receive(self) -> dict:
        return json.loads(broadcast_text(self.groups.broadcast, None))


def _shape(engine) -> tuple[int, int]:
    cfg = engine.config
    return len(cfg.moe_layers), cfg.num_experts_per_tok


def send_results(groups: RankGroups, engine, results: list | None, stats: dict, error: str = "") -> None:
    """From the first engine rank to every rank of the world (the other engine ranks take
    part and drop what they receive): a status line, then the packed results."""
    world, src = groups.results, groups.first_engine
    sending = world.rank == src
    text = broadcast_text(world, json.dumps({"error": error, "stats": stats}) if sending else None, src)
    if json.loads(text)["error"]:
        return
    packed = pack(results, *_shape(engine)) if sending else (None, None, None)
    for t, dtype in zip(packed, (torch.int64, torch.float64, torch.int32)):
        broadcast_tensor(world, t, dtype, src)


def receive_results(groups: RankGroups, engine, prompts: Sequence[Sequence[int]]) -> tuple[list, dict]:
    """The trainer ranks' side of ``send_results``: (results in prompt order, engine stats)."""
    world, src = groups.results, groups.first_engine
    status = json.loads(broadcast_text(world, None, src))
    if status["error"]:
        raise (QuantrollError if world.is_source else PeerFailed)(status["error"])
    ints, lps, routes = (broadcast_tensor(world, None, dtype, src)
                         for dtype in (torch.int64, torch.float64, torch.int32))
    return unpack(ints, lps, routes, prompts, *_shape(engine), engine.route_dtype), status["stats"]


def describe_engines(engine, groups: RankGroups, requests: EngineRequests) -> "RemoteEngines":
    """The engine ranks as a trainer rank sees them, with what they compute in: asked of
    the first engine rank (every trainer rank calls this together)."""
    requests.send("describe")
    said = json.loads(broadcast_text(groups.results, None, groups.first_engine))
    return RemoteEngines(engine, groups, requests, said["precision"], said["kv_cache_label"])


class RemoteEngines:
    """The engine ranks, seen from a trainer rank (the loop's ``engines``: ``generate``,
    ``last_stats``, ``precision``, ``kv_cache_label``, nothing forwarded). ``engine``: this
    trainer rank's engine object, a description on the meta device (no weights, no KV
    pool), never sampled from: the loop asks it directly about the engine (stop tokens,
    config) and it describes the format to the weight broadcast's source; the precision and
    the KV cache's label are the engine ranks' own (``describe_engines``)."""

    def __init__(self, engine, groups: RankGroups, requests: EngineRequests, precision: str, kv_cache_label: str):
        self.engine, self.groups, self.requests = engine, groups, requests
        # the engine ranks' (Engine.precision, Engine.kv_cache_label), not the description's: on
        # the meta device no real FP8 backend and no GPU KV kernel can be chosen
        self.precision, self.kv_cache_label = precision, kv_cache_label
        self.last_stats: dict = {}

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None) -> list:
        self.requests.send("generate", prompts=[list(p) for p in prompts], params=asdict(params),
                           caps=None if max_new_tokens is None else list(max_new_tokens))
        results, self.last_stats = receive_results(self.groups, self.engine, prompts)
        return results


class EngineServer:
    """An engine rank's loop: serve trainer rank 0's requests until ``stop``. ``stage``:
    the placement's context that names a peer whose death broke a collective."""

    def __init__(self, engine, groups: RankGroups, stage):
        self.engine, self.groups, self.stage = engine, groups, stage
        self.requests = EngineRequests(groups)
        self.engines = DataParallelEngines(engine, groups.engines)
        self.sync = None

    def serve(self) -> None:
        while True:
            with self.stage("the wait for trainer rank 0's next request"):
                request = self.requests.receive()
            op = request.pop("op")
            if op == "stop":
                if request.get("error"):
                    raise PeerFailed(f"rank 0: {request['error']}")  # rank 0 said it
                return
            with self.stage(f"the {op} request"):
                self._serve(op, request)

    def _serve(self, op: str, request: dict) -> None:
        try:
            if op == "generate":
                self._generate(request)
            elif op == "describe":
                self._describe()
            elif op == "sync":
                self._sync(request)
            elif op == "update":
                self._update()
            elif op == "check":
                self._check(request["allow_quant_error"])
            else:
                raise QuantrollError(f"trainer rank 0 asked for {op!r}, which this engine rank does not serve; "
                                     "every rank must run the same quantroll")
        except (PeerFailed, NonFiniteError):
            pass  # another rank failed and says so; rank 0 ends the run with ``stop``

    def _generate(self, request: dict) -> None:
        params = request["params"]
        if params.get("stop_token_ids") is not None:
            params["stop_token_ids"] = tuple(params["stop_token_ids"])
        try:
            results = self.engines.generate(request["prompts"], SamplingParams(**params), request["caps"])
        except QuantrollError as err:  # agreed over the engine ranks: the first one tells the trainer ranks
            said = str(err) if isinstance(err, PeerFailed) else f"rank {self.groups.world.rank}: {err}"
            send_results(self.groups, self.engine, None, {}, error=said)
            return
        send_results(self.groups, self.engine, results, self.engines.last_stats)

    def _sync(self, request: dict) -> None:
        from quantroll.distributed.weight_broadcast import BroadcastWeightSync

        self.sync = None  # the old buffers first
        units = [ShardUnit(None, tuple(names)) for names in request["units"]]
        self.sync = BroadcastWeightSync(self.engine, None, units, self.groups.broadcast,
                                        bucket_bytes=request["bucket_bytes"])
        try:
            self.sync.check_layout()
        except QuantrollError:
            self.sync = None  # agreed over the broadcast group: trainer rank 0 says it, then stops us

    def _describe(self) -> None:
        """What the trainer ranks cannot know from their engine descriptions (``describe_engines``)."""
        first = self.groups.first_engine
        said = json.dumps({"precision": self.engine.precision, "kv_cache_label": self.engine.kv_cache_label})
        broadcast_text(self.groups.results, said if self.groups.world.rank == first else None, first)

    def _update(self) -> None:
        try:
            self.sync.push()
        except QuantrollError:
            pass  # a refused load is agreed per unit over the broadcast group: trainer rank 0 says it, then stops us

    def _next_update(self) -> None:
        request = self.requests.receive()
        if request["op"] != "update":
            raise QuantrollError(f"trainer rank 0 sent {request['op']!r} where the checked update was due")
        self.sync.push()

    def _check(self, allow_quant_error: bool) -> None:
        from quantroll.sync import check_weight_update

        worst = 0.0
        try:
            errors = agree(self.groups.world, lambda: check_weight_update(self.engine, self._next_update,
                                                                          allow_quant_error))
            worst = max(errors.values(), default=0.0)
        except QuantrollError:
            return  # agreed over every rank: trainer rank 0 says it
        all_max(self.groups.world, [worst])


__all__ = ["EngineRequests", "EngineServer", "RemoteEngines", "describe_engines", "receive_results", "send_results"]
