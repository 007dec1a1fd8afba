"""Tree verify on the fused Triton path at a real size: what a tree pass costs, and its bits.

    python benchmarks/tree_verify_gpu.py [--out-dir DIR] [--size llama-3.1-8b] [--layers N]
                                         [--context 512] [--nodes 16,32,64] [--branch 2] [--reps 20]

A random-weight model in bf16 (NativeLlama.random, seed 0) and a NativeSlots of two slots sharing
its weights, with CUDA graphs of the pass sizes used only (1 and --nodes rows; a prompt runs in
passes of the largest). After a prompt of --context tokens, for each N of --nodes it times,
alternating in one loop (CUDA events, median of --reps): a verify pass of N rows as a balanced
tree (every node --branch children, breadth first, cut at N rows), the same N rows as a chain, and
a one-row step; then keep_rows of the deepest path. Bits: for a few tree rows per N, the row's
logits against its path decoded one token at a time by one-row NativeSlots passes and by the
NativeLlama's graphed single steps, and triton_forward.forward_tree's over the NativeLlama's cache
against the latter; after keep_rows, the next step against the slot that decoded the path. Any difference is listed and the script exits 1 (after saving the JSON).
Prints a table; saves tree-verify.json in --out-dir. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from specdec.models.native_llama import NativeLlama
from specdec.models.native_slots import NativeSlots, SlotOptions
from specdec.models.triton_forward import forward_tree
from specdec.trees import depths, path_rows


def balanced_tree(rows: int, branch: int) -> tuple[int, ...]:
    """Row parents of a tree whose nodes each get `branch` children, breadth first, cut at `rows`
    rows. Example, rows 6, branch 2: (-1, 0, 0, 1, 1, 2)."""
    parents = [-1]
    node = 0
    while len(parents) < rows:
        parents += [node] * min(branch, rows - len(parents))
        node += 1
    return tuple(parents)


def build(size: str, layers: int | None, max_length: int, nodes: list[int]) -> tuple[NativeLlama, NativeSlots]:
    overrides = {"n_layers": layers} if layers else {}
    llama = NativeLlama.random(size, max_length=max_length, arch_overrides=overrides)
    if not llama.options.fused:
        raise SystemExit("the fused Triton kernels do not run here: this benchmark measures them on CUDA")
    options = SlotOptions(fused=True, graphs=True, graph_rows=tuple(sorted({1, *nodes})), pass_rows=max(nodes))
    return llama, NativeSlots.sharing(llama, 2, max_length, options)


def prefill(llama: NativeLlama, slots: NativeSlots, prompt: torch.Tensor, chunk: int) -> None:
    """The prompt into both slots (one ragged call) and into the NativeLlama (chunks of `chunk`)."""
    slots.forward_ragged([0, 1], [prompt, prompt], logits=[False, False])
    llama.rollback(0)
    for first in range(0, prompt.shape[0], chunk):
        llama.forward(prompt[first:first + chunk])


def timed(fn) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """Run fn between two recorded CUDA events (read their elapsed time after a synchronize)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start, end


def time_passes(slots: NativeSlots, start: int, tree: tuple[int, ...], reps: int) -> dict:
    """Median ms of the tree pass, keep_rows of its deepest path, the chain pass and the one-row
    step, alternating in one loop."""
    tokens = torch.randint(0, slots.vocab_size, (len(tree),), device=slots.device)
    deepest = path_rows(tree, len(tree) - 1)
    cases = {"tree_ms": lambda: slots.forward_ragged([0], [tokens], trees=[tree]),
             "keep_rows_ms": lambda: slots.keep_rows(0, start, deepest),  # right after the tree pass
             "chain_ms": lambda: slots.forward_ragged([0], [tokens]),
             "one_row_ms": lambda: slots.forward_ragged([0], [tokens[:1]])}
    pairs = {name: [] for name in cases}
    for _ in range(reps + 1):  # the first round captures and warms, untimed
        for name, fn in cases.items():
            if name != "keep_rows_ms":
                slots.rollback(0, start)
            pairs[name].append(timed(fn))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in runs[1:]) for name, runs in pairs.items()}


def check_bits(llama: NativeLlama, slots: NativeSlots, start: int, tree: tuple[int, ...]) -> tuple[int, list[str]]:
    """(comparisons made, mismatches): a few tree rows against their paths decoded alone, and
    keep_rows' cache against a slot that decoded the kept path."""
    n = len(tree)
    tokens = torch.randint(0, slots.vocab_size, (n,), device=slots.device)
    slots.rollback(0, start)
    out = slots.forward_ragged([0], [tokens], trees=[tree]).logits_of(0)
    llama.rollback(start)
    alone = forward_tree(llama.net, tokens, start, tree)[0].float()  # over the NativeLlama's own cache
    bad, made = [], 0
    for row in sorted({1, n // 3, 2 * n // 3, n - 1}):
        slots.rollback(1, start)
        llama.rollback(start)
        for r in path_rows(tree, row):
            one_row = slots.forward_ragged([1], [tokens[r:r + 1]]).logits_of(0)[0]
            graphed = llama.forward(tokens[r:r + 1])[0]
        for tree_row, what, ref in ((out[row], "NativeSlots tree pass vs one-row passes", one_row),
                                    (out[row], "NativeSlots tree pass vs NativeLlama graphed steps", graphed),
                                    (alone[row], "forward_tree vs NativeLlama graphed steps", graphed)):
            made += 1
            if not torch.equal(tree_row, ref):
                diff = (tree_row - ref).abs().max().item()
                bad.append(f"N={n} row {row} (depth {depths(tree)[row]}): {what} differ (max |diff| {diff:.3g})")
    path = path_rows(tree, n - 1)
    slots.keep_rows(0, start, path)
    slots.rollback(1, start)
    slots.forward_ragged([1], [tokens[path]], logits=[False])
    nxt = tokens[:1]
    made += 1
    if not torch.equal(slots.forward_ragged([0], [nxt]).logits, slots.forward_ragged([1], [nxt]).logits):
        bad.append(f"N={n}: after keep_rows of path {path} the next step differs from the path decoded")
    return made, bad


def print_table(res: dict) -> None:
    print(f"\n{res['device']}, {res['size']} ({res['layers']} layers), context {res['context']}, "
          f"balanced tree of branch {res['branch']}; ms per pass (median of {res['reps']}, CUDA events)")
    print(f"{'nodes':>5} {'depth':>5} {'tree':>8} {'chain':>8} {'tree/chain':>10} {'one row':>8} {'keep_rows':>9}")
    for r in res["rows"]:
        print(f"{r['nodes']:>5} {r['depth']:>5} {r['tree_ms']:>8.3f} {r['chain_ms']:>8.3f} "
              f"{r['tree_ms'] / r['chain_ms']:>10.3f} {r['one_row_ms']:>8.3f} {r['keep_rows_ms']:>9.3f}")
    bits = res["bits"]
    print(f"bits: {bits['compared']} comparisons, {len(bits['mismatches'])} mismatches")
    for line in bits["mismatches"]:
        print("  MISMATCH", line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=os.environ.get("OUT", "results"))
    p.add_argument("--size", default="llama-3.1-8b")
    p.add_argument("--layers", type=int, default=None, help="fewer layers (a quick smoke run)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--nodes", default="16,32,64", help="tree rows (the root included) per verify pass")
    p.add_argument("--branch", type=int, default=2, help="children per tree node")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tree_verify_gpu.py measures the fused kernels on CUDA: no GPU here")
    nodes = [int(n) for n in args.nodes.split(",")]
    llama, slots = build(args.size, args.layers, args.context + max(nodes) + 64, nodes)
    torch.manual_seed(0)
    prompt = torch.randint(0, slots.vocab_size, (args.context,), device=slots.device)
    prefill(llama, slots, prompt, max(nodes))
    res = dict(device=torch.cuda.get_device_name(), size=args.size, layers=slots.arch.n_layers,
               context=args.context, branch=args.branch, reps=args.reps, rows=[])
    compared, mismatches = 0, []
    for n in nodes:
        tree = balanced_tree(n, args.branch)
        made, bad = check_bits(llama, slots, args.context, tree)  # first: its passes capture the graphs
        compared, mismatches = compared + made, mismatches + bad
        row = dict(nodes=n, depth=max(depths(tree)), **time_passes(slots, args.context, tree, args.reps))
        res["rows"].append(row)
    res["bits"] = dict(compared=compared, mismatches=mismatches)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree-verify.json").write_text(json.dumps(res, indent=1))
    print_table(res)
    if mismatches:
        print(f"FAILED: {len(mismatches)} tree rows differ from their paths decoded alone", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
