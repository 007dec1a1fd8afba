// Panel 1: stream a chat completion and colour each token by where it came from.
// The server adds a non-standard `specdec` field to each streamed choice:
//   {origin: "accepted"|"recovered"|"bonus", round, tokens: [...], stats: {rounds, drafted, accepted, generated}}
// and, on the chunk where a tree round starts, `tree` (the round's draft tree; tree.js draws it).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  let modelId = null;
  let controller = null;
  const trees = window.SpecdecTree.panel($("tree"), $("tree-caption"), $("output"));

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  async function loadModel() {
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      const card = (await r.json()).data[0];
      modelId = card.id;
      $("model-name").textContent = "model: " + card.id;
      const info = card.specdec || { drafters: [], draft: null, k: 4 };
      $("draft").innerHTML = "";
      for (const name of info.drafters) {
        const opt = new Option(name, name, false, name === info.draft);
        $("draft").add(opt);
      }
      $("k").value = info.k;
      $("k").max = info.max_k || 64;
      // Under --speculation auto or K the server's policy picks K; only "request" reads a request's k.
      $("k").disabled = Boolean(info.speculation) && info.speculation !== "request";
      $("k").title = $("k").disabled ? "the server's --speculation " + info.speculation + " policy picks K" : "";
    } catch (err) {
      showError("could not read /v1/models: " + err);
    }
  }

  function showError(message) {
    $("error").hidden = false;
    $("error").textContent = message;
  }

  function showStats(stats, tokens, seconds) {
    if (!stats) return;
    $("stat-alpha").textContent = stats.drafted ? (stats.accepted / stats.drafted).toFixed(2) : "–";
    $("stat-tau").textContent = stats.rounds ? (stats.generated / stats.rounds).toFixed(2) : "–";
    $("stat-rounds").textContent = stats.rounds;
    $("stat-tokens").textContent = tokens;
    $("stat-tps").textContent = seconds > 0 ? (tokens / seconds).toFixed(1) : "–";
  }

  const POLICY = { request: "K: each request's own", fixed: "K: the server's, fixed", auto: "K: auto, a cap per load" };

  // The engine's latest speculation decision (GET /speculation: the same as /metrics' gauges).
  async function showDecision() {
    try {
      const d = await (await fetch("/speculation")).json();
      $("spec-batch").textContent = d.batch_size || "–";
      $("spec-ks").textContent = d.ks.length ? d.ks.join(" ") : "–";
      $("spec-mode").textContent = POLICY[d.mode] || d.mode;
      $("spec-reason").textContent = d.reason || "–";
    } catch (err) {
      // the next poll tries again; the answer stream does not depend on it
    }
  }

  function appendPiece(text, info) {
    const span = document.createElement("span");
    span.className = "tok " + (info.origin || "bonus");
    span.textContent = text;
    span.title = `round ${info.round} · ${info.origin}`;
    span.dataset.round = info.tree ? info.tree.round : info.round;  // the round whose tree a click shows
    $("output").appendChild(span);
  }

  // Yields each parsed `data:` payload of a server-sent event stream.
  async function* sseEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("");
        if (data === "[DONE]") return;
        if (data) yield JSON.parse(data);
      }
    }
  }

  function requestBody() {
    const seed = $("seed").value.trim();  // blank: a fresh draw each time; a number: the same sample again
    return {
      ...(seed === "" ? {} : { seed: Number(seed) }),
      model: modelId,
      messages: [{ role: "user", content: $("prompt").value }],
      max_tokens: Number($("max-tokens").value),
      temperature: Number($("temperature").value),
      ...($("k").disabled ? {} : { k: Number($("k").value) }),
      draft: $("draft").value,
      stream: true,
      stream_options: { include_usage: true },
    };
  }

  async function generate() {
    $("output").textContent = "";
    trees.reset();
    $("error").hidden = true;
    controller = new AbortController();
    $("generate").disabled = true;
    $("stop").disabled = false;
    const start = performance.now();
    const polling = setInterval(showDecision, 250);  // the batch changes as other requests come and go
    let firstAt = null;
    let tokens = 0;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new Error((body.error && body.error.message) || response.statusText);
      }
      for await (const chunk of sseEvents(response)) {
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) { showFinal(chunk.usage, tokens, start, firstAt); continue; }
        const choice = chunk.choices[0];
        const info = choice.specdec;
        if (!choice.delta.content || !info) continue;
        firstAt = firstAt || performance.now();
        tokens += info.tokens.length;
        appendPiece(choice.delta.content, info);
        trees.note(info);
        showStats(info.stats, tokens, (performance.now() - firstAt) / 1000);
      }
    } catch (err) {
      if (err.name !== "AbortError") showError(String(err.message || err));
    } finally {
      clearInterval(polling);
      await showDecision();  // the last step of this answer
      $("generate").disabled = false;
      $("stop").disabled = true;
      document.body.dataset.done = "1"; // lets tests wait for the end of a stream
    }
  }

  function showFinal(usage, tokens, start, firstAt) {
    const s = usage.speculative;
    if (!s) return;
    const stats = { rounds: s.rounds, drafted: s.drafted, accepted: s.accepted, generated: usage.completion_tokens };
    showStats(stats, usage.completion_tokens, s.tokens_per_second ? usage.completion_tokens / s.tokens_per_second
      : (performance.now() - (firstAt || start)) / 1000);
  }

  $("generate").addEventListener("click", () => { delete document.body.dataset.done; generate(); });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("api-key").addEventListener("change", loadModel);
  loadModel();
  showDecision();
})();
