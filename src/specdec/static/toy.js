// Panel 2: the rejection rule on a six-token vocabulary, sampled in the browser.
// p: target distribution, q: draft distribution (after the "toward p" slider), both length 6.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const TOKENS = ["the", "cat", "sat", "on", "a", "mat"];
  const PRESETS = {
    close: { p: [30, 25, 15, 12, 10, 8], q: [25, 30, 15, 10, 12, 8] },
    far: { p: [5, 10, 40, 25, 15, 5], q: [40, 30, 5, 5, 10, 10] },
    disjoint: { p: [0, 0, 0, 40, 35, 25], q: [45, 35, 20, 0, 0, 0] },
    equal: { p: [20, 20, 15, 15, 15, 15], q: [20, 20, 15, 15, 15, 15] },
  };
  // chi-square value exceeded by chance once in 1000 runs, for 1..5 degrees of freedom
  const CHI2_CRIT_001 = [10.83, 13.82, 16.27, 18.47, 20.52];
  const COLORS = { p: "#2f6fdf", q: "#e07a1f", min: "#3a9d5d", res: "#c0392b", obs: "#8e7cc3" };

  const weights = { p: PRESETS.far.p.slice(), q: PRESETS.far.q.slice() };

  const normalize = (w) => { const s = w.reduce((a, b) => a + b, 0); return w.map((x) => (s > 0 ? x / s : 1 / w.length)); };
  const target = () => normalize(weights.p);
  function draft() {  // q moved toward p by the slider t: (1 - t) q + t p
    const t = Number($("toy-mix").value), p = target();
    return normalize(weights.q).map((x, i) => (1 - t) * x + t * p[i]);
  }
  const residual = (p, q) => normalize(p.map((x, i) => Math.max(0, x - q[i])));

  function pick(probs) {  // one draw from a categorical distribution
    let u = Math.random(), i = 0;
    for (; i < probs.length - 1; i++) { u -= probs[i]; if (u < 0) return i; }
    return i;
  }

  // One speculative step: returns {token, drafted, accepted, ratio, u}.
  function step(p, q, res, buggy) {
    const x = pick(q);
    const ratio = q[x] > 0 ? p[x] / q[x] : Infinity;
    const u = Math.random();
    if (u < Math.min(1, ratio)) return { token: x, drafted: x, accepted: true, ratio, u };
    return { token: pick(buggy ? p : res), drafted: x, accepted: false, ratio, u };
  }

  function drawBars(canvas, values, color, marks) {
    const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height, pad = 18;
    const slot = (W - 2 * pad) / values.length, top = Math.max(0.5, ...values, ...(marks || []));
    ctx.clearRect(0, 0, W, H);
    ctx.font = "12px system-ui";
    values.forEach((v, i) => {
      const h = (v / top) * (H - 2 * pad - 12), x = pad + i * slot;
      ctx.fillStyle = color;
      ctx.fillRect(x + 6, H - pad - h, slot - 12, h);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(TOKENS[i], x + 6, H - 4);
      ctx.fillText(v.toFixed(2), x + 6, H - pad - h - 3);
      if (marks) {
        const y = H - pad - (marks[i] / top) * (H - 2 * pad - 12);
        ctx.fillStyle = COLORS.p;
        ctx.fillRect(x + 2, y - 1, slot - 4, 3);
      }
    });
    canvas.dataset.top = top;
  }

  let sampled = false;  // once a histogram is shown, it is redrawn whenever p, q or the bug change

  function render() {
    const p = target(), q = draft();
    drawBars($("toy-p"), p, COLORS.p);
    drawBars($("toy-q"), q, COLORS.q);
    drawBars($("toy-min"), p.map((x, i) => Math.min(x, q[i])), COLORS.min);
    drawBars($("toy-res"), residual(p, q), COLORS.res);
    $("toy-alpha").textContent = p.reduce((a, x, i) => a + Math.min(x, q[i]), 0).toFixed(3);
    if (sampled) sampleMany();
  }

  // Dragging a bar sets that token's weight from the pointer height (the others keep theirs).
  function makeDraggable(canvas, which) {
    let dragging = false;
    const set = (ev) => {
      const rect = canvas.getBoundingClientRect(), pad = 18;
      const i = Math.floor(((ev.clientX - rect.left) / rect.width * canvas.width - pad) / ((canvas.width - 2 * pad) / 6));
      if (i < 0 || i > 5) return;
      const frac = 1 - ((ev.clientY - rect.top) / rect.height * canvas.height - pad) / (canvas.height - 2 * pad);
      const sum = weights[which].reduce((a, b) => a + b, 0) - weights[which][i];
      const share = Math.min(0.95, Math.max(0, frac * Number(canvas.dataset.top || 1)));
      // choose the weight so that this token's normalised probability becomes `share`
      weights[which][i] = sum > 0 ? (share * sum) / (1 - share) : 1;
      render();
    };
    canvas.addEventListener("pointerdown", (ev) => { dragging = true; canvas.setPointerCapture(ev.pointerId); set(ev); });
    canvas.addEventListener("pointermove", (ev) => dragging && set(ev));
    canvas.addEventListener("pointerup", () => { dragging = false; });
  }

  function sampleOne() {
    const p = target(), q = draft(), buggy = $("toy-bug").checked;
    const r = step(p, q, residual(p, q), buggy);
    const d = TOKENS[r.drafted];
    $("toy-trace").textContent = r.accepted
      ? `draft proposed "${d}" (q=${q[r.drafted].toFixed(2)}, p=${p[r.drafted].toFixed(2)}); ` +
        `u=${r.u.toFixed(2)} < min(1, p/q)=${Math.min(1, r.ratio).toFixed(2)} → kept "${d}"`
      : `draft proposed "${d}" (q=${q[r.drafted].toFixed(2)}, p=${p[r.drafted].toFixed(2)}); ` +
        `u=${r.u.toFixed(2)} ≥ p/q=${r.ratio.toFixed(2)} → rejected; drew "${TOKENS[r.token]}" from ` +
        (buggy ? "p (the bug!)" : "the residual");
  }

  // Pearson chi-square of observed counts against n·p; a token with p = 0 that was drawn is Infinity.
  function chiSquare(counts, p, n) {
    let chi2 = 0;
    counts.forEach((c, i) => {
      const expected = n * p[i];
      if (expected > 0) chi2 += (c - expected) ** 2 / expected;
      else if (c > 0) chi2 = Infinity;
    });
    return chi2;
  }

  function sampleMany(n = 10000) {
    const p = target(), q = draft(), res = residual(p, q), buggy = $("toy-bug").checked;
    sampled = true;
    const counts = new Array(6).fill(0);
    let kept = 0;
    for (let j = 0; j < n; j++) { const r = step(p, q, res, buggy); counts[r.token]++; kept += r.accepted; }
    const chi2 = chiSquare(counts, p, n);
    const dof = p.filter((x) => x > 0).length - 1;
    const crit = CHI2_CRIT_001[Math.max(0, dof - 1)];
    drawBars($("toy-hist"), counts.map((c) => c / n), COLORS.obs, p);
    $("toy-chi2").textContent = Number.isFinite(chi2) ? chi2.toFixed(1) : "∞";
    $("toy-chi2").dataset.value = Number.isFinite(chi2) ? chi2 : 1e308;
    $("toy-verdict").textContent = `(${dof} degrees of freedom; above ${crit} happens by chance once in 1000 runs` +
      ` when the output follows p) · ${(100 * kept / n).toFixed(1)}% of drafts kept`;
    $("toy-verdict").style.color = chi2 > crit ? "#b42318" : "";
  }

  $("toy-preset").addEventListener("change", (ev) => {
    const preset = PRESETS[ev.target.value];
    weights.p = preset.p.slice();
    weights.q = preset.q.slice();
    render();
  });
  $("toy-mix").addEventListener("input", render);
  $("toy-one").addEventListener("click", sampleOne);
  $("toy-many").addEventListener("click", () => sampleMany(10000));
  $("toy-bug").addEventListener("change", () => sampled && sampleMany());
  makeDraggable($("toy-p"), "p");
  makeDraggable($("toy-q"), "q");
  render();
})();
