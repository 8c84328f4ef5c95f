"""Weight sync across processes: the trainer's shards -> every engine, in the engine's format.

Per FSDP2 unit (one decoder layer, then embedding/norm, then lm_head), on every rank:

    unshard (all-gather of this layer's BF16 weights)        weight_gather_time
    source rank: quantize with the one-process sync's rules  weight_quantize_time
    broadcast codes + scales (and the BF16 tensors) in       weight_broadcast_time
      buckets of at most ``bucket_bytes``
    every engine: load the bucket in place                   weight_load_time
    reshard

so the extra memory is one layer's full weights plus one bucket. The source quantizes
with the one-process sync's quantizer (``quantroll.sync.update_quantizer``: the
checkpoint's rules, format, MXFP8 scale rule, NVFP4 shared global scales, the Triton plan
on a GPU), so every engine ends bitwise equal to an engine updated by the one-process
sync from the same weights.
BF16 tensors travel as bfloat16 (checked finite at the source; on a CPU the trainer's
float32 tensors hold BF16 values: checked, then cast exactly), quantized weights as
their codes and scales: on a Qwen3 that is ~58% of the BF16 bytes (embeddings, lm_head
and norms stay BF16).

The layout of every bucket follows from each rank's own engine, so the bytes carry no
metadata: the layouts are compared once, when the sync is built (``check_layout``: a
digest, and the first differing tensor named where one differs). Per unit, the source's
verdict on its quantization (a non-finite weight or any other refusal there stops every
rank, not only the source), the buckets, then the loading ranks' verdict, agreed (an
engine that refuses a bucket stops every rank at that unit, named): unit_verdicts.py.
An update is loaded bucket by bucket (each bucket all or nothing) and its version moves
once, at the end; an update that fails midway stops the run, so a half-updated engine is
never sampled from.

Roles (quantroll/distributed/groups.py). Colocated, every rank holds a trainer shard and an
engine: it unshards, and loads what the source sends. With engines on ranks of their
own, the trainer ranks unshard (FSDP2 over the trainer group), trainer rank 0 quantizes
and sends over the broadcast group (itself and the engine ranks) without loading (its
engine is a description on the meta device: format, rules, layout; no memory), the
engine ranks receive and load (their units name the tensors, no module), and
the other trainer ranks take part in the unshard only (``ctx`` None). The slowest
engine's load time and the engines' version reach the source at the end.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch

from quantroll.distributed.buckets import DEFAULT_BUCKET_BYTES, Bucket, first_difference, layout, manifest, pack_into, views
from quantroll.distributed.collectives import all_max, all_true, broadcast, broadcast_text
from quantroll.distributed.context import DistContext
from quantroll.distributed.fsdp import ShardUnit
from quantroll.distributed.unit_verdicts import UnitVerdicts
from quantroll.errors import NonFiniteError, QuantrollError
from quantroll.formats import QuantizedTensor
from quantroll.sync.update_quantizer import UpdateQuantizer
from quantroll.sync.copy_reference import copy_seconds, engine_weight_bytes, synchronize

WIRE_DTYPE = torch.bfloat16
PARTS = ("data", "scale", "global")


@dataclass(frozen=True)
class BroadcastTiming:
    gather_s: float
    quantize_s: float
    broadcast_s: float
    load_s: float
    bytes_sent: int  # payload bytes the source broadcast this update
    bf16_bytes: int  # what the same tensors take in BF16 (the ratio is the wire's saving)
    version: int
    copy_s: float  # one copy of the engine's weight bytes on this rank's device (sync/copy_reference.py)

    def metrics(self) -> dict[str, float]:
        return {"weight_gather_time": self.gather_s, "weight_quantize_time": self.quantize_s,
                "weight_broadcast_time": self.broadcast_s, "weight_load_time": self.load_s,
                "weight_update_bytes": float(self.bytes_sent), "weight_update_bf16_bytes": float(self.bf16_bytes),
                "weight_copy_time": self.copy_s, "weight_version": self.version}


class BroadcastWeightSync:
    """The update of ``engine`` (this rank's) from the sharded ``policy``; every rank calls
    ``push`` together. ``ctx``: the broadcast group (None: this rank only unshards);
    ``src``: the rank in it that quantizes and sends; ``loads``: this rank's engine takes
    the update (False on a source whose engine only describes the format). ``trainers``:
    the trainer group when it is not the broadcast group (engines on ranks of their own):
    the source tells it each unit's verdict too, so that a refusal at the source stops the
    trainer ranks outside the broadcast group at the same unit (they would otherwise wait
    in the next unit's unshard for a source that has left)."""

    def __init__(self, engine, policy, units: list[ShardUnit], ctx: DistContext | None, src: int = 0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, loads: bool = True, trainers: DistContext | None = None):
        self.engine, self.policy, self.units, self.ctx, self.src = engine, policy, units, ctx, src
        self.trainers = trainers
        self.is_src, self.loads, self.bucket_bytes = ctx is not None and ctx.rank == src, loads, bucket_bytes
        self.quantized = engine.quantized_layers()
        state = engine.state()
        # a tensor this rank's engine lacks is said by check_layout, agreed, so that the
        # other ranks leave with it instead of waiting in the layout's collectives
        self.layout_error: QuantrollError | None = None
        try:
            self.layouts = [layout(self._groups(unit, state), bucket_bytes) for unit in units]
            self.bf16_bytes = sum(self._numel(n, state) * 2 for u in units for n in u.names)
        except QuantrollError as err:
            self.layouts, self.bf16_bytes, self.layout_error = [], 0, err
        size = max((b.nbytes for buckets in self.layouts for b in buckets), default=0) if ctx is not None else 0
        group = ctx if ctx is not None else trainers  # a trainer rank outside the broadcast group hears statuses
        self.device = group.device if group is not None else engine.device  # (its engine: on the meta device)
        self.buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.verdicts = UnitVerdicts(ctx, src, trainers, self.device, loads)
        # quantizers on this rank's device, one per unit (each keeps its own GPU plan across
        # updates); the source's engine may be a description on the meta device
        self.quantizers = [UpdateQuantizer(engine, self.device) for _ in units] if self.is_src else []
        self.copy_s = copy_seconds(engine_weight_bytes(engine), self.device)

    def _numel(self, name: str, state: dict) -> int:
        layer = self.quantized.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
        return layer.out_features * layer.in_features if layer is not None else state[name].numel()

    def _groups(self, unit: ShardUnit, state: dict) -> list[list[tuple[str, torch.dtype, tuple[int, ...]]]]:
        """What the engine holds for each of the unit's tensors, as it travels."""
        groups = []
        for name in unit.names:
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module in self.quantized:
                q = self.quantized[module].quantized_weight()
                parts = [("data", q.data), ("scale", q.scale), ("global", q.global_scale)]
                groups.append([(f"{name}:{p}", t.dtype, tuple(t.shape)) for p, t in parts if t is not None])
            elif name in state:
                groups.append([(name, WIRE_DTYPE, tuple(state[name].shape))])
            else:
                raise QuantrollError(f"the trainer's {name} has no counterpart in the engine; the two must hold the "
                                     "same model")
        return groups

    def check_layout(self) -> None:
        """Every receiver's bucket layout (computed from its own engine) must be the
        source's, or bytes would land in the wrong tensors: a digest first, the whole
        manifest only when one differs, so that the rank that differs names the first tensor
        where it does. Called once after construction, by every rank that pushes; the
        trainer ranks outside the broadcast group hear the verdict from the source."""
        if self.ctx is None:
            # the source's verdict first: its description is this rank's, so a tensor missing
            # here is missing there too, and the source says so to everyone
            self.verdicts.hear_relay()
            if self.layout_error is not None:
                raise self.layout_error
            return
        mine = manifest(self.layouts)
        digest = hashlib.sha256("\n".join(mine).encode()).hexdigest()
        same = (broadcast_text(self.ctx, digest if self.is_src else None, self.src) == digest
                and self.layout_error is None)
        if all_true(self.ctx, same):
            self.verdicts.relay()
            return
        theirs = broadcast_text(self.ctx, "\n".join(mine) if self.is_src else None, self.src).split("\n")

        def compare() -> None:
            if self.layout_error is not None:
                raise self.layout_error
            if (where := first_difference(mine, theirs)) is not None:
                raise QuantrollError(f"the weight update's layout differs from the source's: {where}; the trainer and "
                                     "every engine must load the same model with the same quantroll")
        self.verdicts.agreed(compare)

    # -- the source's side ---------------------------------------------------------------
    def _payload(self, index: int) -> dict[str, torch.Tensor]:
        """The unit's update as the wire carries it (the unit is unsharded)."""
        named = {n: self.policy.get_parameter(n).detach() for n in self.units[index].names}
        out = {}
        for name, value in self.quantizers[index].quantize(named).items():
            if isinstance(value, QuantizedTensor):
                out[f"{name}:data"], out[f"{name}:scale"] = value.data, value.scale
                if value.global_scale is not None:
                    out[f"{name}:global"] = value.global_scale
            else:  # a quantized weight's finiteness is its quantizer's check; a BF16 one's is here, so
                # that NaN/Inf stops every rank at the source, named, before a byte of it is sent
                if not bool(torch.isfinite(value).all()):
                    raise NonFiniteError(f"weight update: tensor '{name}' holds NaN/Inf value(s); the trainer's "
                                         "weights diverged (lower the learning rate or check the loss)", tensor=name)
                wire = value.to(self.device, WIRE_DTYPE)
                if value.dtype != WIRE_DTYPE and not torch.equal(wire.to(value.dtype), value.to(self.device)):
                    raise QuantrollError(f"the trainer's {name} holds values that are not BF16; the optimizer must "
                                         "round its weights to BF16 (MasterWeightAdamW's weight_dtype)")
                out[name] = wire
        return out

    # -- every rank ----------------------------------------------------------------------
    def _load(self, data: torch.Tensor, bucket: Bucket) -> None:
        parts = views(data, bucket)
        entries, quantized = [], {}
        for key, t in parts.items():
            name, _, part = key.partition(":")
            if part:
                quantized.setdefault(name, {})[part] = t
            else:
                entries.append((name, t))
        for name, p in quantized.items():
            layer = self.quantized[name.removesuffix(".weight")]
            ref = layer.quantized_weight()
            entries.append((name, QuantizedTensor(p["data"], p["scale"], ref.format, ref.shape, ref.block,
                                                  p.get("global"))))
        self.engine.load_weights(entries, commit=False)

    @torch.no_grad()
    def push(self) -> BroadcastTiming:
        device, member = self.device, self.ctx is not None
        times = dict(gather=0.0, quantize=0.0, broadcast=0.0, load=0.0)
        sent = 0

        def lap(key: str, since: float) -> float:
            synchronize(device)
            now = time.perf_counter()
            times[key] += now - since
            return now

        for index, unit in enumerate(self.units):
            t = time.perf_counter()
            if unit.module is not None:  # a trainer rank: FSDP2 gathers the unit from the trainer ranks
                unit.module.unshard()
            try:
                t = lap("gather", t)
                if member:
                    sent += self._unit(index, lap, t)
                else:  # a trainer rank outside the broadcast group: the source's word on the unit
                    self.verdicts.hear_relay()
            finally:
                if unit.module is not None:
                    unit.module.reshard()
        version = self.engine.load_weights([], commit=True) if self.loads else 0
        if member:  # the update is done when the slowest engine has loaded it
            times["load"], version = all_max(self.ctx, [times["load"], float(version)])
        return BroadcastTiming(times["gather"], times["quantize"], times["broadcast"], times["load"], sent,
                               self.bf16_bytes, int(version), self.copy_s)

    def _unit(self, index: int, lap, t: float) -> int:
        """One unshard unit through the broadcast group: the source's verdict on its
        quantization, its buckets, then every loading rank's verdict on its loads (agreed
        over the group, so that an engine that refuses a bucket stops every rank at this
        unit, named, instead of leaving the others in the next unit's collectives); the
        trainer ranks outside the group hear the unit's outcome from the source. The bytes sent."""
        sent = 0

        def quantized() -> dict[str, torch.Tensor]:  # timed without the verdict's exchange after it
            nonlocal t
            out = self._payload(index)
            t = lap("quantize", t)
            return out

        payload = self.verdicts.source_outcome(quantized)
        refusal = None
        for bucket in self.layouts[index]:
            data = self.buffer[: bucket.nbytes]
            if self.is_src:
                pack_into(self.buffer, bucket, payload)
            broadcast(self.ctx, data, self.src)  # a rank that refused a bucket still takes part
            sent += bucket.nbytes
            t = lap("broadcast", t)
            if self.loads and refusal is None:
                try:
                    self._load(data, bucket)
                except QuantrollError as err:
                    refusal = err
                t = lap("load", t)
        self.verdicts.agreed(lambda: _raise(refusal))
        return sent


def _raise(error: Exception | None) -> None:
    if error is not None:
        raise error
