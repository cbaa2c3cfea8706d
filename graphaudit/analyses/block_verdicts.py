"""Can a block be skipped or shrunk for some inputs? One verdict per block, with evidence.

Verdicts (docs/design.md, "Execution verdicts"), strongest first:

- `branch`: the block's compute sits in an If branch or Loop body whose condition or trip
  count depends on input values (or in an ONNX Runtime search operator's decoder);
- `subset`: its compute reads rows picked by value — Gather / Slice / Compress driven by
  NonZero, TopK indices, ArgMax — or tensors whose extent depends on values (a fixed-size
  pick is a *capacity*; a NonZero-sized one is data-dependent); or it multiplies by experts'
  weights picked out of a stack (experts × in × out) by a routed index, as a batched MoE
  does (each token runs only its top-k experts; a fixed size); ONNX Runtime's MoE too;
- `masked`: routing exists (TopK / ArgMax / NonZero of values) but every path is computed
  at full size and then multiplied, combined (MatMul / Einsum) or picked by the routing
  result, or a Where chooses between two of the block's results by a value-dependent
  condition;
- `gated`: a coefficient tensor weights the block's output (Mul / MatMul / Einsum);
- `always`: none of the above: every node runs for every input, at a size set by shapes.

Only `branch` and `subset` can save compute. An If or Loop decided by a constant or by
input shapes alone is not dynamic; nor is a switch (`analyses.switches`): an If whose branches
run the same compute on the same weights, or whose condition the caller decides
(`analyses.decisions`). Who decides each If and Loop is kept with the verdicts: conditional
execution (some compute runs or not as an input's value decides) may be the caller's choice;
`branch` is the model's.
"""

from __future__ import annotations

from graphaudit.analyses.block_evidence import BlockVerdict, Evidence, ExecutionVerdicts
from graphaudit.analyses.blockmap import Block, BlockMap
from graphaudit.analyses.coefficient_reach import GATING, block_upstream, reached_consumers
from graphaudit.analyses.controls import control_evidence
from graphaudit.analyses.decisions import CALLER, VALUE_DECIDERS, callers_alone, describe
from graphaudit.analyses.declared_coefficients import Coefficient
from graphaudit.analyses.dependence import VALUE, DependenceMap
from graphaudit.analyses.dispatch import combines, dispatch_operands, indicates
from graphaudit.analyses.flops import is_counted
from graphaudit.analyses.loop_trips import Value
from graphaudit.analyses.switches import SWITCH
from graphaudit.graph.model import ModelGraph, Node, Scope, TensorRef
from graphaudit.graph.visit_order import execution_order
from graphaudit.vocabulary import ALWAYS, BRANCH, GATED, MASKED, SAVES_COMPUTE, SUBSET, VERDICTS

ROUTING = frozenset({"TopK", "ArgMax", "ArgMin", "NonZero", "Unique"})
SELECTING = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Compress"})
SCATTERING = frozenset({"ScatterND", "ScatterElements", "Scatter", "TensorScatter"})
MASKING = frozenset({"Mul", "Where", "Div", "MatMul", "Einsum"})  # how a routing result weights paths
NORMALISING = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                         "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNormalization",
                         "BatchNormalization", "InstanceNormalization"})
CONTRIB_ROUTED = frozenset({"MoE", "QMoE", "SparseMoE"})
# Ops that broadcast their inputs together, elementwise.
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Max", "Min", "Sum", "Mean", "Pow"})
# Ops that only lay picked weights out differently on their way to the MatMul that reads them.
LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Identity", "Expand",
                    "Slice", "Split"})
_INDEX_TYPES = frozenset({2, 3, 4, 5, 6, 7, 9, 12, 13})  # (u)int8..64 and bool


def execution_verdicts(
    mg: ModelGraph, blocks: BlockMap, coefficients: tuple[Coefficient, ...], dependence: DependenceMap,
    value: Value | None = None,
) -> ExecutionVerdicts:
    """Return the ExecutionVerdicts of `mg` with its blocks, coefficients and dependence. `value`:
    the value of a constant tensor (`trips.constant_values`), for the trip counts of Loops."""
    return _Audit(mg, blocks, coefficients, dependence, value).run()


def _op(node: Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


class _Audit:
    def __init__(self, mg, blocks, coefficients, dm, value=None):
        self.mg, self.blocks, self.coefficients, self.dm, self.value = mg, blocks, coefficients, dm, value
        self.evidence: dict[str, list[Evidence]] = {}  # node id -> evidence found at it
        self.kinds: dict[str, str] = {}  # node id -> verdict that evidence supports
        self.skippable: set[str] = set()
        self.selector_of: dict[str, tuple] = {}  # selection node -> (data, chooser, routing node)
        self.counted: set[str] = set()  # nodes whose FLOPs are counted: the compute nodes
        self.position: dict[str, int] = {}  # node id -> its place in execution order
        # Whether any tensor's extent may depend on input values (one the map leaves out reads as
        # VALUE): where none does (a dense model), no compute node reads one (`_compute`).
        self.value_sized = VALUE in dm.shapes.values() or len(dm.shapes) < len(mg.tensors)

    def note(self, at: str, verdict: str, ev: Evidence) -> None:
        self.evidence.setdefault(at, []).append(ev)
        self.kinds.setdefault(at, verdict)

    def run(self) -> ExecutionVerdicts:
        controls, dynamic, decided = control_evidence(self.mg, self.dm, self.value)
        self.chosen = {d.node: d for d in decided if d.conditional and d.decided_by == CALLER}
        self._regions(dynamic)
        self._gates()
        self._flow()
        per_block = tuple(self._verdict(b) for b in self.blocks.blocks)
        outside = tuple(ev for nid, evs in self.evidence.items() if self.blocks.block_of(nid) is None
                        for ev in evs if self.kinds[nid] in SAVES_COMPUTE and ev.kind not in ("branch", "loop"))
        return ExecutionVerdicts(blocks=per_block, controls=controls, outside=_dedupe(outside),
                                 conditional_execution=any(d.conditional and d.decided_by in VALUE_DECIDERS
                                                           for d in decided),
                                 decisions=decided, model_decides=bool(dynamic),
                                 data_dependent_compute=any(k == SUBSET for k in self.kinds.values()),
                                 skippable=frozenset(self.skippable))

    # -- control flow ----------------------------------------------------------------------
    def _regions(self, dynamic: dict[str, Evidence]) -> None:
        """Mark every node under a dynamic If / Loop / search operator as skippable."""
        self.region: dict[str, str] = {}
        for node in self.mg.nodes.values() if dynamic else ():
            owner = next((s.owner for s in node.scopes if s.owner in dynamic), None)
            if owner is not None:
                self.region[node.id] = owner
                self.skippable.add(node.id)
        self.dynamic = dynamic
        for owner in dynamic:
            self.kinds.setdefault(owner, BRANCH)
            self.evidence.setdefault(owner, []).append(dynamic[owner])

    # -- data flow: routing, selection, masks ----------------------------------------------
    def _flow(self) -> None:
        mg, dm = self.mg, self.dm
        routed: dict[TensorRef, str] = {}  # index / mask tensors derived from a routing op
        selected: dict[TensorRef, str] = {}  # activations picked by a routed index
        mask: dict[TensorRef, str] = {}  # anything computed from a routing decision
        picked: set[TensorRef] = set()  # picks of results computed at full size, no compute since
        computed: dict[TensorRef, str] = {}  # activation -> the compute node nearest upstream
        weights: dict[TensorRef, str] = {}  # experts' weights picked by a routed index (not their results)
        dispatched: set[TensorRef] = set()  # results of compute on picked rows (an expert's on its tokens)
        indicator: set[TensorRef] = set()  # masks of 0s and 1s a routing decision set (`analyses.dispatch`)
        position, counted_nodes, kinds = self.position, self.counted, self.kinds
        for place, node in enumerate(execution_order(mg)):
            position[node.id] = place
            ins = [*filter(None, node.inputs)]  # a TensorRef is a non-empty tuple: None alone is false
            outs = [*filter(None, node.outputs)]
            op = node.op_type if node.domain in ("", "ai.onnx") else None
            counted = is_counted(node)
            if counted:
                counted_nodes.add(node.id)
            # The tables below stay empty in a dense model: each test reads them only when not.
            if op in ROUTING and ins and dm.value(ins[0]) == VALUE:
                for k, out in enumerate(outs):
                    mask[out] = node.id
                    # TopK's values are indices too where it sorts routed indices (Mixture-of-
                    # Depths keeps its chosen tokens in order: torch.sort exports as TopK)
                    if op != "TopK" or k == 1 or ins[0] in routed:
                        routed[out] = node.id
            elif not counted and routed and not routed.keys().isdisjoint(ins):
                origin = next(routed[r] for r in ins if r in routed)
                for out in outs:
                    if self._index_like(out):
                        routed[out] = origin
            if mask and indicates(mg, node, mask, indicator):
                indicator.update(outs)
            one_hot = dispatch_operands(node, indicator) if indicator and op == "Einsum" else None
            if one_hot is not None and one_hot[1] not in selected and dm.value(one_hot[1]) == VALUE:
                self.selector_of[node.id] = (one_hot[1], one_hot[0], mask.get(one_hot[0]))
                selected.update(dict.fromkeys(outs, node.id))
                if one_hot[1] in computed:
                    picked.update(outs)
            elif op in SELECTING and len(ins) >= 2:
                self._select(node, routed, selected)
                if node.id in self.selector_of and ins[0] in computed:
                    picked.update(outs)
                if routed and self._expert_weights(node, routed):
                    self.selector_of[node.id] = (ins[0], ins[1], routed.get(ins[1]))
                    weights.update(dict.fromkeys(outs, node.id))
            elif weights and op in LAYOUT and not weights.keys().isdisjoint(ins):  # reshaped, transposed
                origin = next(weights[r] for r in ins if r in weights)
                weights.update(dict.fromkeys(outs, origin))
            elif (selected and not selected.keys().isdisjoint(ins) and op not in SCATTERING
                  and op not in ("Shape", "Size") and not (op == "Einsum" and combines(node, selected, lambda r: dm.value(r) == VALUE))):
                origin = next(selected[r] for r in ins if r in selected)
                for out in outs:
                    if op not in ELEMENTWISE or not self._whole_again(out, ins, selected):
                        selected.setdefault(out, origin)
            if counted:
                self._compute(node, selected, weights)
            if kinds.get(node.id) == SUBSET or (dispatched and op not in SCATTERING
                                                     and not dispatched.isdisjoint(ins)):
                dispatched.update(outs)
            if node.domain == "com.microsoft" and node.op_type in CONTRIB_ROUTED:
                self.note(node.id, SUBSET, Evidence(
                    "contrib", node.id, _op(node), node.inputs[1].name if len(node.inputs) > 1 and node.inputs[1] else None,
                    "value", f"{_op(node)} `{node.id}` routes each token to its top-k experts inside the "
                             "operator: each expert runs on a value-dependent subset of tokens",
                    "data-dependent"))
                self.skippable.add(node.id)
            if picked and not counted and not picked.isdisjoint(ins):
                picked.update(outs)
            # A selection's output is the data it picked, a mask only when that data was one.
            mask_in = [r for r in (ins[:1] if op in SELECTING else ins) if r in mask] if mask else []
            dense = [r for r in ins if r in computed and r not in mask
                     and (r not in selected or r in picked)] if mask_in else []
            if mask_in and dense and op in MASKING and node.id not in self.selector_of:
                origin = mg.nodes[mask[mask_in[0]]]
                ranks = self.ranks.get(origin.id)
                at = self._masked_at(node, dense + [r for r in ins if r not in dense])
                # what it weights: a result of the block the evidence goes to (not a passthrough)
                own = next((r for r in dense if self._block_making(r) == self.blocks.block_of(at)), dense[0])
                self.note(at, MASKED, Evidence(
                    "routing mask", node.id, _op(node), mask_in[0].name, "value",
                    f"{_op(node)} `{node.id}` weights `{own.name}`, computed at full size, "
                    f"by `{mask_in[0].name}` from {_op(origin)} `{origin.id}`"
                    + (f" on {ranks.family} coefficient `{ranks.tensor}`" if ranks else "")))
                for out in outs:  # a weighted mix of full-size results: no longer picked rows
                    selected.pop(out, None)
                    picked.discard(out)
            elif op == "Where" and self._chooses_computed(node, computed):
                cond, a, b = [r for r in node.inputs if r is not None]  # it took three given operands
                self.note(node.id, MASKED, Evidence(
                    "routing mask", node.id, _op(node), cond.name, "value",
                    f"{_op(node)} `{node.id}` chooses between `{a.name}` and `{b.name}`, both computed at "
                    f"full size, by `{cond.name}`, which depends on input values"))
            elif op == "Where" and (new := self._keeps_or_takes(node, computed)) is not None:
                cond, a, b = [r for r in node.inputs if r is not None]  # it took three given operands
                self.note(self._masked_at(node, [new]), MASKED, Evidence(
                    "routing mask", node.id, _op(node), cond.name, "value",
                    f"{_op(node)} `{node.id}` keeps `{(b if new == a else a).name}` or takes `{new.name}`, which "
                    f"this block computed at full size for every row, by `{cond.name}`, which depends on input "
                    "values (a per-token exit that still computes every token)"))
            # a routing decision flows on as a mask, but not into an expert's result on its own rows:
            # that result weighted by TopK's values (torch's `w, chosen = probs.topk(k)`) is the stream
            elif mask_in and not counted and op not in NORMALISING and dispatched.isdisjoint(ins) and (
                    op not in SCATTERING or self._scatters_mask(node, mask, routed, dispatched)):
                for out in outs:
                    mask.setdefault(out, mask[mask_in[0]])
            maker = node.id if counted else next(filter(None, map(computed.get, ins)), None)
            if maker is not None:
                for out in outs:
                    computed[out] = maker

    def _scatters_mask(self, node: Node, mask, routed, dispatched) -> bool:
        """Whether a scatter's result is a routing mask: it edits one, or it writes by routed indices
        into zeros (a canvas set by shapes) what no compute on picked rows made: a dense routing
        matrix, zeros.scatter(1, topk_idx, topk_w). Rows written back into the stream, and experts'
        results added into zeros at their tokens (a dispatch's combine), are the stream again."""
        data, index, updates = (list(node.inputs) + [None] * 3)[:3]  # TensorScatter's: cache, update, where
        if data in mask or updates in mask:
            return True
        return node.op_type != "TensorScatter" and None not in (data, updates) and index in routed \
            and updates not in dispatched and self.dm.value(data) != VALUE

    def _whole_again(self, out: TensorRef, ins, selected) -> bool:
        """Whether the broadcast `out` has the extent of an input that holds no picked rows (a
        residual stream a per-token pick is added back into): what follows runs on every row
        again. Broadcasting gives the output every dimension of an input of its rank that is
        not 1."""
        info = self.mg.tensors.get(out)
        rank = len(info.shape) if info is not None and info.shape is not None else None
        return rank is not None and any(
            r not in selected and self.dm.value(r) == VALUE and (other := self.mg.tensors.get(r)) is not None
            and other.shape is not None and len(other.shape) == rank and 1 not in other.shape
            and not any(isinstance(d, str) and d.startswith("unk__") for d in other.shape) for r in ins)

    def _chooses_computed(self, node: Node, computed: dict[TensorRef, str]) -> bool:
        """Whether a Where picks, by a value-dependent condition, between two results of its
        own block's compute: both paths ran. A constant or filled branch (the -inf of an
        attention mask) and a condition set by shapes (a causal mask) are no choice of path."""
        if len(node.inputs) != 3 or None in node.inputs or self.dm.value(node.inputs[0]) != VALUE:
            return False
        block = self.blocks.block_of(node.id)
        return block is not None and all(
            r in computed and self.dm.value(r) == VALUE and self.blocks.block_of(computed[r]) == block
            for r in node.inputs[1:])

    def _keeps_or_takes(self, node: Node, computed: dict[TensorRef, str]) -> TensorRef | None:
        """For a Where in no block that, by a value-dependent condition, keeps an earlier state
        or takes what a block just made (CALM's exited tokens: where(exited, h, block(h))): that
        block's result; else None."""
        if len(node.inputs) != 3 or None in node.inputs or self.blocks.block_of(node.id) is not None \
                or self.dm.value(node.inputs[0]) != VALUE:
            return None
        options = node.inputs[1:]
        if not all(self.dm.value(r) == VALUE for r in options):  # a constant or filled option is no state
            return None
        made = [(r, self._block_making(r) if r in computed else None) for r in options]
        inside = [(r, b) for r, b in made if b is not None]
        if not inside or (len(inside) == 2 and inside[0][1] == inside[1][1]):
            return None  # no block's result, or both one block's (_chooses_computed's case)
        return max(inside, key=lambda rb: rb[1].index)[0]

    def _block_making(self, ref: TensorRef) -> Block | None:
        producer = self.mg.producer(ref)
        return self.blocks.block_of(producer.id) if producer is not None else None

    def _masked_at(self, node: Node, dense: list[TensorRef]) -> str:
        """Where a masking node's evidence goes: the node itself when it is in a block, else the
        node that made what it masks (`dense`, in order of preference), in the block that made it
        (a mask applied between blocks)."""
        if self.blocks.block_of(node.id) is not None:
            return node.id
        producer = next((p for p in map(self.mg.producer, dense) if p is not None
                         and self.blocks.block_of(p.id) is not None), None)
        return producer.id if producer is not None else node.id

    def _index_like(self, ref: TensorRef) -> bool:
        info = self.mg.tensors.get(ref)
        return info is None or info.elem_type is None or info.elem_type in _INDEX_TYPES

    def _select(self, node: Node, routed, selected) -> None:
        ins = node.inputs
        data = ins[0]
        if data is None or self.dm.value(data) != VALUE:
            return
        if node.op_type == "Compress":
            chooser = ins[1] if self.dm.value(ins[1]) == VALUE else None
        elif node.op_type == "Slice":
            chooser = next((r for r in ins[1:3] if r is not None and r in routed), None)
        else:
            chooser = ins[1] if ins[1] in routed else None
        if chooser is None:
            return
        for out in node.outputs:
            if out is not None:
                selected[out] = node.id
        self.selector_of[node.id] = (data, chooser, routed.get(chooser))

    def _expert_weights(self, node: Node, routed) -> bool:
        """Whether `node` picks matrices out of a stack of weights (experts × in × out) by a routed
        index: each token then runs only the experts it was routed to, as a batched MoE does."""
        info = self.mg.tensors.get(node.inputs[0])
        stacked = info is not None and info.shape is not None and len(info.shape) >= 3 \
            and self.dm.value(node.inputs[0]) != VALUE  # weights, not activations
        axis = next((a.i for a in node.proto.attribute if a.name in ("axis", "batch_dims")), 0)
        first_axis = node.op_type in ("Gather", "GatherND") and axis == 0
        return stacked and first_axis and node.inputs[1] in routed

    def _compute(self, node: Node, selected, weights) -> None:
        mg, dm = self.mg, self.dm
        picked = next((r for r in node.inputs if r is not None and r in selected), None) if selected else None
        expert = next((r for r in node.inputs if r is not None and r in weights), None) if weights else None
        if picked is not None or expert is not None:
            sel = mg.nodes[selected[picked] if picked is not None else weights[expert]]
            data, chooser, origin = self.selector_of[sel.id]
            size = "data-dependent" if dm.shape(picked if picked is not None else expert) == VALUE \
                else "fixed (capacity)"
            source = f" (from {_op(mg.nodes[origin])} `{origin}`)" if origin else ""
            caller = callers_alone(mg, mg.nodes[origin]) if origin else None
            what = f"rows of `{data.name}`" if picked is not None and sel.op_type != "Einsum" else \
                f"at most a fixed number of rows of `{data.name}` per expert into its slots (a one-hot dispatch)" \
                if picked is not None else \
                f"experts' weights out of `{data.name}` (each token runs only the experts it is routed to)"
            ev = Evidence("selection", sel.id, _op(sel), chooser.name, "value",
                          f"{_op(sel)} `{sel.id}` picks {what} by `{chooser.name}`{source}, "
                          f"feeding {_op(node)} `{node.id}`; selected size {size}"
                          + (f"; chosen by the graph input{'s' if len(caller) > 1 else ''} "
                             f"{', '.join(f'`{n}`' for n in caller)} alone, through no learned computation (a "
                             "caller's mask, as padding removal reads one): the input decides, not the model"
                             if caller else ""), size)
        else:
            varying = next((r for r in node.inputs if r is not None and dm.shape(r) == VALUE), None) \
                if self.value_sized else None
            if varying is None:
                return
            ev = Evidence("extent", node.id, _op(node), varying.name, "value",
                          f"{_op(node)} `{node.id}` reads `{varying.name}`, whose extent depends on input "
                          "values", "data-dependent")
        self.note(node.id, SUBSET, ev)
        self.skippable.add(node.id)

    # -- coefficients ----------------------------------------------------------------------
    def _gates(self) -> None:
        mg = self.mg
        self.gate_of: dict[int, list[Evidence]] = {}
        self.ranks: dict[str, Coefficient] = {}  # routing node -> the coefficient whose scores it ranks
        for c in self.coefficients:
            ref = mg.find_tensor(c.tensor)
            if ref is None:
                continue
            reached = [node for node, _ in reached_consumers(mg, ref, limit=64)]
            for node in reached:
                if node.op_type in ROUTING:
                    self.ranks.setdefault(node.id, c)
            for node in _gating(reached):
                ev = Evidence("gate", node.id, _op(node), c.tensor, str(self.dm.of(ref)),
                              f"coefficient `{c.tensor}` ({c.family}, layer {c.layer}) weights "
                              f"{_op(node)} `{node.id}`")
                # applied between the blocks (x + g·block(x)): the gate belongs to what it weights;
                # on what no block computes (a stem's features, ahead of the blocks) it gates none
                block = (self.blocks.block_of(node.id)
                         or block_upstream(mg, [r for r in node.inputs if r is not None and r != ref], self.blocks))
                if block is not None:
                    self.gate_of.setdefault(block.index, []).append(ev)

    # -- verdict ---------------------------------------------------------------------------
    def _verdict(self, block: Block) -> BlockVerdict:
        mg = self.mg
        ids = block.node_ids
        compute = {n for n in ids if n in self.counted} or set(ids)
        found: dict[str, list[Evidence]] = {}
        owners: dict[str, dict[Scope, int]] = {}  # dynamic owner -> its branch or body -> nodes in it
        for nid in sorted(compute):
            if nid in self.region:
                owner = self.region[nid]
                scope = next(s for s in mg.nodes[nid].scopes if s.owner == owner)
                counts = owners.setdefault(owner, {})
                counts[scope] = counts.get(scope, 0) + 1
        for owner, counts in owners.items():
            control = self.dynamic[owner]
            by_kind = sorted(counts.items(), key=lambda item: item[0].kind, reverse=True)  # then- before else-branch
            (first, n), *others = by_kind
            where = "".join(f" and {m} only in the {scope.describe()}" for scope, m in others)
            found.setdefault(BRANCH, []).append(Evidence(
                control.kind, owner, control.op, control.tensor, "value",
                f"{n} of the block's {len(compute)} compute nodes run only in the {first.describe()}{where}; "
                f"{control.detail.split(': ', 1)[-1]}"))
        for nid in sorted(ids, key=self.position.__getitem__):  # the compute picked rows reach first
            for ev in self.evidence.get(nid, ()):
                if self.kinds[nid] != BRANCH:
                    found.setdefault(self.kinds[nid], []).append(ev)
        if self.gate_of.get(block.index):  # what weights first, what chooses or divides after
            found[GATED] = sorted(self.gate_of[block.index], key=lambda ev: ev.op in ("Where", "Div"))
        verdict = next((v for v in reversed(VERDICTS) if found.get(v)), ALWAYS)
        evidence = [ev for v in reversed(VERDICTS) for ev in found.get(v, ())] + self._chosen_in(compute)
        return BlockVerdict(block, verdict, _dedupe(evidence), frozenset(ids & self.skippable))


    def _chosen_in(self, compute: set[str]) -> list[Evidence]:
        """Where some of `compute` runs only in a branch of an If the caller decides: which, and
        by which input (what runs depends on it, by the caller's choice, not the model's)."""
        found = []
        for owner, decision in self.chosen.items() if self.chosen else ():
            scopes = [next(s for s in self.mg.nodes[n].scopes if s.owner == owner) for n in compute
                      if any(s.owner == owner for s in self.mg.nodes[n].scopes)]
            if scopes:
                first = max(set(scopes), key=lambda scope: (scopes.count(scope), scope.kind))
                found.append(Evidence(SWITCH, owner, decision.op, ", ".join(decision.tensors) or None, "value",
                                      f"{scopes.count(first)} of the block's {len(compute)} compute nodes run only "
                                      f"in the {first.describe()}, which {describe(decision)} chooses"))
        return found


def _gating(reached: list[Node]) -> list[Node]:
    """The Mul / MatMul / Einsum / Where nodes among those a coefficient reaches through reshapes
    and slices, those that weight (Mul, MatMul, Einsum, Gemm) before those that choose or divide
    (Where, Div)."""
    return sorted((n for n in reached if n.op_type in GATING), key=lambda n: n.op_type in ("Where", "Div"))


def _dedupe(evidence) -> tuple[Evidence, ...]:
    seen, out = set(), []
    for ev in evidence:
        key = (ev.kind, ev.node, ev.tensor)
        if key not in seen:
            seen.add(key)
            out.append(ev)
    return tuple(out)
