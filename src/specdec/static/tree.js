// The live view's tree panel: the latest tree round's draft tree, or the round of a clicked token.
// Draws one round's draft tree as SVG: the root (the text so far) on the left, each depth a column,
// siblings in node order from the top; the kept path in the accepted colour, and the round's
// recovered or bonus token after it (dashed edge). A tree is the stream's `specdec.tree`:
//   {round, tokens: [node text], parents: [-1 = root, else an earlier node], path: [kept nodes], next: {token, origin} | null}
"use strict";

window.SpecdecTree = (function () {
  const SVG = "http://www.w3.org/2000/svg";
  const ROW = 26, GAP = 22, PAD = 6, CHAR = 7.4, NODE_H = 20;

  // A token's text as a label: spaces and line breaks made visible, an empty piece marked.
  function shown(text) {
    return text === "" ? "∅" : text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥");
  }

  // Nodes to draw: index -1 is the root, 0..n-1 the draft's nodes, n the token after the path.
  function layoutNodes(tree) {
    const n = tree.tokens.length;
    const kept = new Set(tree.path);
    const nodes = [{ id: -1, label: "▶", parent: null, cls: "root", title: "the text so far" }];
    tree.tokens.forEach((token, j) => nodes.push({
      id: j, label: shown(token), parent: tree.parents[j], cls: kept.has(j) ? "kept" : "rejected",
      title: `node ${j}${kept.has(j) ? " · kept" : ""}`,
    }));
    if (tree.next) {
      const end = tree.path.length ? tree.path[tree.path.length - 1] : -1;
      nodes.push({ id: n, label: shown(tree.next.token), parent: end, cls: "next " + tree.next.origin,
        title: tree.next.origin + " (the target's token after the kept path)" });
    }
    return nodes;
  }

  // Depth and row of every node: a leaf takes the next free row; a parent sits at its first child's row.
  function place(nodes) {
    const byId = new Map(nodes.map((node) => [node.id, node]));
    for (const node of nodes) node.children = [];
    for (const node of nodes) if (node.parent !== null) byId.get(node.parent).children.push(node);
    let row = 0;
    (function visit(node, depth) {
      node.depth = depth;
      node.children.forEach((child) => visit(child, depth + 1));
      node.row = node.children.length ? node.children[0].row : row++;
    })(byId.get(-1), 0);
    return row;
  }

  function columns(nodes) {
    const widths = [];
    for (const node of nodes) {
      node.width = Math.max(28, Math.round(node.label.length * CHAR) + 2 * PAD);
      widths[node.depth] = Math.max(widths[node.depth] || 0, node.width);
    }
    const x = [PAD];
    widths.forEach((w, d) => { x[d + 1] = x[d] + w + GAP; });
    return x;
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    parent.appendChild(e);
    return e;
  }

  function draw(svg, tree) {
    svg.replaceChildren();
    const nodes = layoutNodes(tree);
    const rows = place(nodes);
    const x = columns(nodes);
    const y = (node) => PAD + node.row * ROW;
    const byId = new Map(nodes.map((node) => [node.id, node]));
    for (const node of nodes) {
      if (node.parent === null) continue;
      const from = byId.get(node.parent);
      const kept = node.cls === "kept" || node.cls.startsWith("next");
      el("path", { class: "edge" + (kept ? " kept" : "") + (node.cls.startsWith("next") ? " next" : ""),
        d: `M${x[from.depth] + from.width},${y(from) + NODE_H / 2} C${x[node.depth] - GAP / 2},${y(from) + NODE_H / 2}`
          + ` ${x[node.depth] - GAP / 2},${y(node) + NODE_H / 2} ${x[node.depth]},${y(node) + NODE_H / 2}` }, svg);
    }
    for (const node of nodes) {
      const g = el("g", { class: "node " + node.cls, "data-node": node.id,
        transform: `translate(${x[node.depth]},${y(node)})` }, svg);
      el("title", {}, g).textContent = node.title;
      el("rect", { width: node.width, height: NODE_H, rx: 3 }, g);
      el("text", { x: node.width / 2, y: NODE_H / 2 + 4, "text-anchor": "middle" }, g).textContent = node.label;
    }
    svg.setAttribute("width", x[x.length - 1]);
    svg.setAttribute("height", PAD * 2 + rows * ROW);
  }

  const KEPT_TREES = 200;  // trees of the answer's latest rounds that a click can still show

  // The panel over an <svg>, a caption and the output whose token spans (data-round) a click selects.
  function panel(svg, caption, output) {
    const trees = new Map();  // round -> tree, oldest first

    function show(round) {
      const tree = trees.get(round);
      if (!tree) {
        caption.textContent = `round ${round}: no tree (a chain round, a plain step, or too old to keep)`;
        return;
      }
      caption.textContent = `round ${round}: ${tree.tokens.length} nodes, ${tree.path.length} kept`
        + (tree.next ? `, then ${tree.next.origin}` : "");
      svg.dataset.round = round;
      draw(svg, tree);
    }

    // A streamed chunk's `specdec` field: a tree round's first chunk brings its tree, drawn at once;
    // a round without one (a chain, or no draft) leaves the drawing as it is and says so.
    function note(info) {
      if (info.tree) {
        trees.set(info.tree.round, info.tree);
        if (trees.size > KEPT_TREES) trees.delete(trees.keys().next().value);
        return show(info.tree.round);
      }
      const kind = info.tokens.some((t) => t.origin !== "bonus") ? "a chain round" : "a plain step";
      caption.textContent = `round ${info.round}: ${kind}, no tree`
        + (svg.dataset.round === undefined ? " (draft tree:… to see trees)" : `; drawn: round ${svg.dataset.round}`);
    }

    function reset() {
      trees.clear();
      svg.replaceChildren();
      delete svg.dataset.round;
      caption.textContent = "a tree draft (tree:…) draws each round here; click a token for its round's tree";
    }

    output.addEventListener("click", (event) => {
      const span = event.target.closest("span.tok");
      if (!span) return;
      for (const old of output.querySelectorAll("span.tok.selected")) old.classList.remove("selected");
      span.classList.add("selected");
      show(Number(span.dataset.round));
    });
    reset();
    return { note, reset };
  }

  return { draw, panel };
})();
