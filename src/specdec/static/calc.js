// Panel 3: expected speedup from alpha, K and c (the formulas of specdec/speedup.py).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const K_MAX = 16;

  const tau = (alpha, k) => (alpha >= 1 ? k + 1 : (1 - alpha ** (k + 1)) / (1 - alpha));
  const speedup = (alpha, k, c) => tau(alpha, k) / (k * c + 1);

  function chart(alpha, kNow, c) {
    const canvas = $("calc-chart"), ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height, L = 44, B = 28, T = 12, R = 12;
    const ks = Array.from({ length: K_MAX }, (_, i) => i + 1);
    const ys = ks.map((k) => speedup(alpha, k, c));
    const top = Math.max(1.5, ...ys) * 1.1;
    const x = (k) => L + ((k - 1) / (K_MAX - 1)) * (W - L - R);
    const y = (v) => H - B - (v / top) * (H - B - T);
    ctx.clearRect(0, 0, W, H);
    ctx.font = "12px system-ui";
    ctx.strokeStyle = "#d8dde6";
    ctx.fillStyle = "#667085";
    for (let v = 0; v <= top; v += top > 4 ? 1 : 0.5) {  // horizontal grid
      ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(W - R, y(v)); ctx.stroke();
      ctx.fillText(v.toFixed(1) + "x", 6, y(v) + 4);
    }
    ks.forEach((k) => ctx.fillText(String(k), x(k) - 4, H - 10));
    ctx.fillText("K", W - R - 8, H - 24);
    ctx.strokeStyle = "#b42318";  // break-even: plain decoding
    ctx.setLineDash([4, 4]);
    ctx.beginPath(); ctx.moveTo(L, y(1)); ctx.lineTo(W - R, y(1)); ctx.stroke();
    ctx.setLineDash([]);
    ctx.strokeStyle = "#2f6fdf";
    ctx.lineWidth = 2;
    ctx.beginPath();
    ks.forEach((k, i) => (i ? ctx.lineTo(x(k), y(ys[i])) : ctx.moveTo(x(k), y(ys[i]))));
    ctx.stroke();
    ctx.lineWidth = 1;
    ctx.fillStyle = "#e07a1f";
    ctx.beginPath(); ctx.arc(x(kNow), y(ys[kNow - 1]), 5, 0, 2 * Math.PI); ctx.fill();
  }

  function update() {
    const alpha = Number($("calc-alpha").value), k = Number($("calc-k").value), c = Number($("calc-c").value);
    $("calc-alpha-v").textContent = alpha.toFixed(2);
    $("calc-k-v").textContent = k;
    $("calc-c-v").textContent = c.toFixed(2);
    $("calc-tau").textContent = tau(alpha, k).toFixed(2);
    $("calc-speedup").textContent = speedup(alpha, k, c).toFixed(2) + "x";
    let best = 1;  // smallest K with the highest speedup, as speedup.best_k picks it
    for (let kk = 2; kk <= K_MAX; kk++) if (speedup(alpha, kk, c) > speedup(alpha, best, c) + 1e-12) best = kk;
    $("calc-best").textContent = `${best} (${speedup(alpha, best, c).toFixed(2)}x)`;
    chart(alpha, k, c);
  }

  ["calc-alpha", "calc-k", "calc-c"].forEach((id) => $(id).addEventListener("input", update));
  update();
})();
