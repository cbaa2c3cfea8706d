"""Which nodes form layer i: blocks found from names, metadata, weights or structure.

Every node offers *candidates* — (container, index) pairs such as ("blocks", 3) — read from,
in order of trust:

1. torch's name-scope metadata (`namespace`, else `pkg.torch.onnx.name_scopes`): the module
   path of the deepest module the node was traced in;
2. the parameters named in torch's `pkg.torch.onnx.fx_node` metadata (`%p_blocks_2_fc_weight`),
   which survive inside `If` branches where the name scope is cut short;
3. the node's own name when it is a TorchScript-style path (`/model/layers.3/mlp/MatMul`);
4. the names of the initializers it reads (`gpt_neox.layers.3.mlp.weight`), when it is their
   only reader (exporters share de-duplicated weights between layers), and where a name
   follows the index: a value its exporter numbered (Paddle2ONNX's `p2o.helper.constant.12`,
   `p2o.pd_op.full.9.0`) is no module's parameter.

The container offered by the most nodes (at least two indices where any has two) names the
blocks, together with any other container of at least a quarter as many nodes that no node
names along with it (an encoder-decoder's `encoder.block` and `decoder.block`, numbered on
from the first; not the sublayers or experts numbered inside a block). A `--block-pattern`
regex replaces the candidates with its own matches, searched in the same texts and, after
the dotted path of 3, in the node's name as it is. Nodes nested
in a body without candidates of their own take their owner's block, or the block of their
neighbours among those the owner's metadata names (graphaudit.analyses.block_fill). With no names at all, blocks are cut
along the residual chain (graphaudit.analyses.structure).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from graphaudit.analyses.block_fill import Candidates, fill_unnamed, place_owners
from graphaudit.analyses.blockmap import (
    NAME_SCOPES,
    NAMESPACE,
    SOURCES,
    BlockMap,
    block_map,
    blocks_text,
    make_blocks,
    module_paths,
    recount,
)
from graphaudit.analyses.flops import is_counted
from graphaudit.errors import UsageError
from graphaudit.graph.model import ModelGraph, Node

FX_NODE = "pkg.torch.onnx.fx_node"
_TRACE_KEYS = frozenset({NAMESPACE, NAME_SCOPES, FX_NODE})
_FX_PARAM = re.compile(r"%[pb]_([A-Za-z0-9_]+)")
_SEPARATORS = re.compile(r"[^0-9A-Za-z]+")
# A number that is a whole component of a module path: `layers.3.mlp`, `/blocks.0/`, `blocks_2_fc`.
_PATH_NUMBER = re.compile(r"(?<=[./])(\d+)(?=[./]|$)")
_FX_NUMBER = re.compile(r"(?<=_)(\d+)(?=_|$)")
# After a module's index, a parameter's name (`layers.3.mlp.weight`); after an exporter's count
# of values, none (`p2o.helper.constant.12`, `p2o.pd_op.full.9.0`: an op and an output number).
_NAMED = re.compile(r"[A-Za-z]")
_INDEX_DIGITS = 18  # the most digits a block number has, from names and from a --block-pattern alike

def find_blocks(mg: ModelGraph, pattern: str | None = None) -> BlockMap:
    """Return the BlockMap of `mg`, from `pattern` when given, else from names or structure."""
    regex = _compile(pattern) if pattern is not None else None
    finder = _Finder(mg, regex)
    found = finder.by_names()
    if found is not None:
        from graphaudit.analyses.repeats import split_repeats  # it builds on this module's types

        return split_repeats(mg, found if regex is not None else _without_empty_tail(mg, found))
    if regex is not None:
        raise UsageError(
            f"expected --block-pattern {pattern!r} to match node names, name scopes or "
            f"initializer names, found no match among {len(mg.nodes)} nodes (e.g. "
            f"{', '.join(repr(n) for n in finder.examples())})"
        )
    from graphaudit.analyses.structure import structural_blocks  # it builds on this module's types

    return structural_blocks(mg)


def _without_empty_tail(mg: ModelGraph, bm: BlockMap) -> BlockMap:
    """`bm` without its last block when that one computes nothing while every other does: a
    final normalisation named as one more layer (ONNX Runtime GenAI's model builder writes
    `/model/layers.N/final_norm_layernorm` after N layers) is the model's, not a layer's."""
    if len(bm.blocks) < 3:
        return bm
    *layers, last = bm.blocks
    computes = [any(is_counted(mg.nodes[n]) for n in b.node_ids) for b in bm.blocks]
    if computes[-1] or not all(computes[:-1]):
        return bm
    ops = ", ".join(sorted({mg.nodes[n].op_type for n in last.node_ids}))
    counts = Counter(dict(bm.sources))
    note = f"`{last.name}` is left out: no matrix product, convolution or attention, as in the others ({ops} only)"
    return block_map(tuple(layers), recount(bm.method, len(bm.blocks), len(layers)) + f"; {note}", counts, bm.placed)


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise UsageError(f"expected --block-pattern to be a regular expression, found {pattern!r} ({err})") from None


def _key(container: str) -> str:
    return _SEPARATORS.sub(".", container).strip(".").lower()


class _Finder:
    def __init__(self, mg: ModelGraph, regex: re.Pattern | None):
        self.mg = mg
        self.regex = regex
        self._unnumbered: dict[str, int] = {}
        self._parsed: dict[tuple[str, str], list[tuple[str, int, str]]] = {}  # layers repeat texts
        self._keys: dict[str, str] = {}
        self._by_folder: dict[str, list[tuple[str, int, str]]] = {}  # "/model/layers.3/mlp" -> parsed
        self._folders: dict[str, tuple[str, list[tuple[str, int, str]]]] = {"": ("", [])}  # see _folder
        self._numbers: dict[str, list[tuple[int, str]]] = {}  # a folder's last component -> its numbers

    # -- candidates ------------------------------------------------------------------------
    def texts(self, node: Node) -> Iterator[tuple[str, list[str]]]:
        """(source, texts) for `node`, most trusted source first (lazily: most nodes need one)."""
        if node.metadata:
            paths = module_paths(node)
            if paths:
                yield "metadata", paths[-1:]
            fx = node.meta(FX_NODE)
            if fx:
                params = _FX_PARAM.findall(fx)
                if params:
                    yield "fx_params", params
        if "/" in node.name:
            parts = [p for p in node.name.split("/") if p][:-1]
            if parts:
                yield "node_names", [".".join(parts)]
        if self.regex is not None and node.name:
            yield "node_names", [node.name]  # a user's regex may spell the name as the graph does
        # a weight read by this node alone (the graph model's table of readers, which later
        # analyses read too: counting every node's inputs here cost a tenth of this analysis)
        inits = [r.name for r in node.inputs if r is not None and not r.scope
                 and r.name in self.mg.initializers and len(self.mg.consumers(r)) == 1]
        if inits:
            yield "initializers", inits

    def candidates(self, node: Node) -> Iterator[Candidates]:
        """(source, [(key, index, display name)]) for `node`, most trusted source first."""
        for source, texts in self.texts(node):
            cands: list[tuple[str, int, str]] = []
            for text in texts:
                parsed = self._parsed.get((source, text))
                if parsed is None:
                    parsed = self._parsed[(source, text)] = self._parse(source, text)
                cands.extend(parsed)
            if cands:
                yield source, cands

    def first(self, node: Node) -> Candidates | None:
        """next(self.candidates(node), None): the candidates by_names asks of every node.

        The usual node (no metadata, a path-like name that names a block) is read here
        without the generators.
        """
        folder, _, last = node.name.rpartition("/")
        if not node.metadata and last:
            # Nodes of one module share the folder of their name, hence its text and candidates.
            parsed = self._by_folder.get(folder)
            if parsed is None:
                if self.regex is None:
                    parsed = self._folder(folder)[1]
                else:  # a user's regex reads the whole text
                    text = ".".join([p for p in folder.split("/") if p])
                    parsed = self._parsed.get(("node_names", text))
                    if parsed is None:
                        parsed = self._parsed[("node_names", text)] = self._parse("node_names", text) if text else []
                self._by_folder[folder] = parsed
            if parsed:
                return "node_names", parsed
        return next(self.candidates(node), None)

    def _folder(self, folder: str) -> tuple[str, list[tuple[str, int, str]]]:
        """The dotted text of a node name's folder ("/model/layers.3/mlp": "model.layers.3.mlp")
        and its candidates, as `_parse` reads that text: those of the folder above it, then
        those numbered in its last component. A number lies within one component (the dot
        that joins two is no digit), so only each distinct component meets the regex: layers
        repeat them, and parsing each layer's folders whole was a third of this analysis."""
        chain = []  # the folders down from the nearest one already read (walked, not recursed)
        while folder not in self._folders:
            chain.append(folder)
            folder = folder.rpartition("/")[0]
        text, parsed = self._folders[folder]
        for folder in reversed(chain):
            last = folder.rpartition("/")[2]
            if last:
                piece = f".{last}" if text else last  # as joined: the dot lets a number open the component
                numbers = self._numbers.get(piece)
                if numbers is None:
                    numbers = self._numbers[piece] = [(m.start(), m.group(1)) for m in _PATH_NUMBER.finditer(piece)]
                start = len(text)
                text += piece
                if numbers:
                    parsed = parsed + [c for at, number in numbers
                                       if (c := self._candidate(text[: start + at].strip("./_"), number)) is not None]
            self._folders[folder] = (text, parsed)
        return text, parsed

    def _parse(self, source: str, text: str) -> list[tuple[str, int, str]]:
        if self.regex is not None:
            m = self.regex.search(text)
            return [("pattern", self._pattern_index(m), m.group(0))] if m else []
        numbered = _FX_NUMBER if source == "fx_params" else _PATH_NUMBER
        found = []
        for m in numbered.finditer(text):
            if source != "initializers" or _NAMED.search(text, m.end()):
                candidate = self._candidate(text[: m.start()].strip("./_"), m.group(1))
                if candidate is not None:
                    found.append(candidate)
        return found

    def _candidate(self, container: str, number: str) -> tuple[str, int, str] | None:
        """(key, index, display name) of block `number` of `container`; None without a container,
        or for a number too long to be a block's (int() refuses past 4,300 digits, and no model
        has 10^18 layers: a hash or a counter in a name)."""
        if not container or len(number) > _INDEX_DIGITS:
            return None
        key = self._keys.get(container)
        if key is None:
            key = self._keys[container] = _key(container)
        return key, int(number), f"{container}.{number}"

    def _pattern_index(self, m: re.Match) -> int:
        """The block number a --block-pattern match gives: its `index` group, else its first
        numeric group, else the order in which the matched text first appears."""
        index = m.groupdict().get("index")
        # int() takes no more than 4300 digits; a block number has a few.
        if index and not (index.isascii() and index.isdigit() and len(index) <= _INDEX_DIGITS):
            raise UsageError(
                f"expected the `index` group of --block-pattern {m.re.pattern!r} to match digits "
                f"(a block number), found {index[:60]!r}"
            )
        text = index or next((g for g in m.groups() if g and g.isascii() and g.isdigit() and len(g) <= _INDEX_DIGITS), None)
        if text is not None:
            return int(text)
        return self._unnumbered.setdefault(m.group(0), len(self._unnumbered))

    def examples(self) -> list[str]:
        seen = [t for n in list(self.mg.nodes.values())[:50] for _, ts in self.texts(n) for t in ts]
        return seen[:3] or [n.name for n in list(self.mg.nodes.values())[:3]]

    # -- assignment ------------------------------------------------------------------------
    def by_names(self) -> BlockMap | None:
        mg = self.mg
        # Each node votes with its most trusted source that names any numbered container.
        first = {nid: self.first(n) for nid, n in mg.nodes.items()}
        coverage: Counter = Counter()
        indices: dict[str, set[int]] = {}
        nested: set[tuple[str, str]] = set()  # containers named by one node together (one inside the other)
        for found in first.values():
            if found is None:
                continue
            if len(found[1]) == 1:  # the common case, kept cheap
                k, i, _ = found[1][0]
                coverage[k] += 1
                seen = indices.get(k)
                if seen is None:
                    indices[k] = {i}
                else:
                    seen.add(i)
                continue
            keys = {(k, i) for k, i, _ in found[1]}
            named = {k for k, _ in keys}
            nested.update((a, b) for a in named for b in named if a != b)
            for k in named:
                coverage[k] += 1
            for k, i in keys:
                indices.setdefault(k, set()).add(i)
        if not coverage:
            return None
        multi = [k for k in coverage if len(indices[k]) >= 2] or list(coverage)
        chosen = max(multi, key=lambda k: (coverage[k], -len(k)))
        stacks = self._stacks(chosen, multi, coverage, indices, nested, first)
        assigned: dict[str, int] = {}
        names: dict[int, str] = {}
        named_by: dict[int, str] = {}  # the source each block's name was read from
        how: dict[str, str] = {}
        informative: set[str] = set()
        for node, found in zip(mg.nodes.values(), first.values()):
            nid = node.id
            # Torch's trace of a node that names no block puts it outside them; other metadata
            # (an onnxscript rewriter's rule name) says nothing of where a node belongs.
            if not node.scopes and ("/" in node.name or any(k in _TRACE_KEYS for k, _ in node.metadata)):
                informative.add(nid)
            if found is None:
                continue
            if len(found[1]) == 1 and found[1][0][0] in stacks:  # the common case, kept cheap
                key, index, name = found[1][0]
                index += stacks[key]
                assigned[nid] = index
                if index not in names:
                    names[index], named_by[index] = name, found[0]
                how[nid] = "pattern" if self.regex is not None else found[0]
                continue
            sources = [found] if any(k in stacks for k, _, _ in found[1]) else self.candidates(node)
            for source, cs in sources:
                hits = [(i + stacks[k], name) for k, i, name in cs if k in stacks]
                if not hits:
                    continue
                votes = Counter(i for i, _ in hits)
                if source == "fx_params" and len(votes) != 1:
                    continue
                index = votes.most_common(1)[0][0]
                assigned[nid] = index
                if index not in names:
                    names[index], named_by[index] = next(name for i, name in hits if i == index), source
                how[nid] = "pattern" if self.regex is not None else source
                break
        fill_unnamed(mg, assigned, how, informative, stacks, self.candidates)
        place_owners(mg, assigned, how)
        if self.regex is None and len(stacks) == 1:
            _spell_alike(names, named_by)
        blocks = make_blocks(assigned, names)
        # not `chosen == "pattern"`: without a regex that is a container's name ("/pattern.3/...")
        if self.regex is not None:
            label = self.regex.pattern
        elif len(stacks) > 1:
            label = "`, `".join(dict.fromkeys(names[i].rsplit(".", 1)[0] for i in sorted(names)))
        else:
            label = names[min(names)].rsplit(".", 1)[0] if names else chosen
        counts = Counter(how.values())
        main = counts.most_common(1)[0][0] if counts else "pattern"
        method = (f"{SOURCES[main]}: {blocks_text(len(blocks))} under `{label}`"
                  if main != "pattern" else f"--block-pattern {label!r}: {blocks_text(len(blocks))}")
        extra = [f"{n} nodes by {SOURCES[s]}" for s, n in counts.most_common() if s != main]
        if extra:
            method += " (" + "; ".join(extra) + ")"
        return block_map(blocks, method, counts, how)

    def _stacks(self, chosen: str, multi, coverage: Counter, indices: dict[str, set[int]],
                nested: set[tuple[str, str]], first: dict) -> dict[str, int]:
        """The numbered containers that name blocks, each with the offset of its first block:
        `chosen`, and beside it any other container of as many as a quarter of its nodes that
        no node names together with another (an encoder-decoder's `encoder.block` and
        `decoder.block`; not the `experts` numbered inside each layer) and whose layers run
        before or after those of the others, not between them (not a controller numbered by
        the layers it serves: DynamicViT's `score_predictor.0` before its third block). In the
        order their nodes first appear, numbered on from one container to the next."""
        if chosen == "pattern":
            return {chosen: 0}
        candidates = [k for k in sorted(multi, key=lambda k: (-coverage[k], len(k)))  # the outer of a nested pair first
                      if k != chosen and coverage[k] * 4 >= coverage[chosen] and len(indices[k]) >= 2]
        if not candidates:
            return {chosen: 0}
        position: dict[str, int] = {}
        starts: dict[str, set[int]] = {}  # container -> where each of its layers first appears
        seen: set[tuple[str, int]] = set()
        for at, found in enumerate(first.values()):
            for k, i, _ in found[1] if found else ():
                position.setdefault(k, at)
                if (k, i) not in seen:
                    seen.add((k, i))
                    starts.setdefault(k, set()).add(at)

        def between(a: str, b: str) -> bool:  # a layer of one starts within the other's span
            return any(min(starts[b]) < at < max(starts[b]) for at in starts[a]) or \
                any(min(starts[a]) < at < max(starts[a]) for at in starts[b])

        keys = [chosen]
        for k in candidates:
            if not any((k, other) in nested for other in keys) and not any(between(k, other) for other in keys):
                keys.append(k)
        if len(keys) == 1:
            return {chosen: 0}
        stacks, offset = {}, 0
        for k in sorted(keys, key=lambda k: position.get(k, 0)):
            stacks[k] = offset
            offset += max(indices[k]) + 1
        return stacks

def _spell_alike(names: dict[int, str], named_by: dict[int, str]) -> None:
    """Name the blocks whose name came from fx parameter names (`m_blocks.2`: the module path's
    dots are underscores there) as the other blocks are named (`m.blocks.2`)."""
    spelled = Counter(name.rsplit(".", 1)[0] for i, name in names.items() if named_by.get(i) != "fx_params")
    if spelled:
        container = spelled.most_common(1)[0][0]
        for index, source in named_by.items():
            if source == "fx_params":
                names[index] = f"{container}.{index}"
