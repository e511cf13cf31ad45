// "Run live": the tested library itself, in the reader's browser, offline.
//
// On a click, loads Pyodide (vendored through package.json) from the book's own _vendor/pyodide/,
// unpacks the servebook wheel the book build made (_vendor/live/), and binds plain HTML controls to
// servebook.live (JSON in, JSON out). Every number and chart comes from Python; nothing here
// computes. Nothing loads before the click, and nothing is fetched from any other origin.
// Placed on a page by the `live-calculator` directive (book/_ext/live_calculator.py); copied to
// _vendor/live/ by scripts/_common.sh (vendor_js).
(function () {
  "use strict";
  const here = document.currentScript && document.currentScript.src;
  if (!here) return;
  const VENDOR = new URL("../", here);                 // .../_vendor/
  const PYODIDE = new URL("pyodide/", VENDOR);
  const LIVE = new URL("live/", VENDOR);
  const state = { runtime: null, timings: { clicks: 0 } };
  window.servebookLive = state;                        // read by the browser test and the benchmark

  // One Pyodide per page, however many calculators it has.
  function runtime() {
    if (!state.runtime) state.runtime = boot();
    return state.runtime;
  }

  async function boot() {
    const t0 = performance.now();
    const manifest = await (await fetch(new URL("manifest.json", LIVE))).json();
    const { loadPyodide } = await import(new URL("pyodide.mjs", PYODIDE).href);
    const pyodide = await loadPyodide({ indexURL: PYODIDE.href });
    const wheel = await fetch(new URL(manifest.wheel, LIVE));
    if (!wheel.ok) throw new Error(`the servebook wheel ${manifest.wheel} did not load (HTTP ${wheel.status})`);
    pyodide.unpackArchive(await wheel.arrayBuffer(), "wheel");
    const live = pyodide.pyimport("servebook.live");
    const options = JSON.parse(pyodide.runPython("import json, servebook.live as _l; json.dumps(_l.options())"));
    state.timings.ready_ms = performance.now() - t0;
    return { live, options };
  }

  // -- controls -------------------------------------------------------------------------------
  const FIELDS = {
    plan: ["model", "gpu", "tp", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype"],
    kv: ["model", "context_tokens", "kv_cache_dtype", "tp"],
    chunk: ["model", "gpu", "tp", "max_num_seqs", "context_tokens", "target_step_ms", "kv_cache_dtype"],
    fleet: ["model", "gpu", "gpus", "tp", "requests", "input_tokens", "output_tokens", "max_num_batched_tokens",
            "cudagraph_max_tokens", "kv_cache_dtype"],
    speculation: ["model", "gpu", "tp", "k", "acceptance", "batch", "context_tokens", "kv_cache_dtype"],
    tune: ["model", "gpu", "gpus", "rate", "input_tokens", "output_tokens", "ttft_ms", "tpot_ms"],
  };
  // Calculators whose one computation is a whole search (seconds, not milliseconds): they recompute
  // when a control is committed (change: Enter, leaving the box, a new choice), not on every
  // keystroke, and say so while Python works.
  const SLOW = new Set(["tune"]);
  const LABELS = {
    model: "model", gpu: "GPU", tp: "tensor parallel (--tensor-parallel-size)",
    max_model_len: "context (--max-model-len, tokens)", context_tokens: "context (tokens)",
    gpu_memory_utilization: "utilisation (--gpu-memory-utilization)", kv_cache_dtype: "KV dtype (--kv-cache-dtype)",
    max_num_seqs: "decoding sequences (--max-num-seqs)", target_step_ms: "target step time (ms)",
    k: "draft tokens per step (k)", acceptance: "acceptance per draft token (0-1)", batch: "sequences decoding",
    gpus: "GPUs in the fleet", requests: "requests in the job", input_tokens: "prompt tokens per request",
    output_tokens: "output tokens per request", max_num_batched_tokens: "--max-num-batched-tokens",
    cudagraph_max_tokens: "largest CUDA-graph step, tokens (0: vLLM's default)",
    rate: "arrival rate (requests/s, Poisson)", ttft_ms: "p90 TTFT target (ms)", tpot_ms: "p90 TPOT target (ms)",
  };
  // A field's label where one calculator means something narrower by it.
  const LABELS_FOR = { tune: { gpus: "most GPUs to use (--gpus)" } };
  // Step of each number box's arrows (any value may be typed).
  const STEPS = { max_model_len: "1024", context_tokens: "1024", max_num_seqs: "1", target_step_ms: "5",
                  k: "1", acceptance: "0.05", batch: "1", gpus: "1", requests: "100000", input_tokens: "500",
                  output_tokens: "100", max_num_batched_tokens: "1024", cudagraph_max_tokens: "1024",
                  rate: "1", ttft_ms: "100", tpot_ms: "5" };
  const PASTE = "__paste__";

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const child of children || []) node.append(child);
    return node;
  }

  function select(name, values, value, labels) {
    const box = el("select", { name });
    for (const v of values) box.append(el("option", { value: v }, [labels && labels[v] ? labels[v] : v]));
    box.value = String(value);
    return box;
  }

  function control(name, options, value) {
    switch (name) {
      case "model": {
        const labels = { [PASTE]: "paste a config.json…" };
        return select(name, [...options.models, PASTE], value, labels);
      }
      case "gpu": return select(name, options.gpus, value);
      case "tp": return select(name, ["1", "2", "4", "8"], value);
      case "kv_cache_dtype": return select(name, options.kv_cache_dtypes, value, { auto: "auto (the model's dtype)" });
      case "gpu_memory_utilization":
        return el("input", { name, type: "number", step: "0.01", min: "0.05", max: "1", value: String(value) });
      default:
        return el("input", { name, type: "number", step: STEPS[name] || "1", min: "0", value: String(value) });
    }
  }

  function render(container, reply) {
    const out = container.querySelector(".servebook-live-output");
    const error = container.querySelector(".servebook-live-error");
    if (!reply.ok) {
      error.textContent = reply.error;
      error.hidden = false;
      out.classList.add("servebook-live-stale");
      return;
    }
    error.hidden = true;
    error.textContent = "";
    out.classList.remove("servebook-live-stale");
    const rows = reply.numbers.map((n) => el("tr", {}, [
      el("th", {}, [n.label]),
      el("td", { "data-key": n.key, "data-value": JSON.stringify(n.value) }, [n.text]),
    ]));
    out.replaceChildren(el("table", { class: "servebook-live-numbers" }, rows));
    if (reply.svg) {
      const chart = el("div", { class: "servebook-live-chart" });
      chart.innerHTML = reply.svg;                     // drawn by servebook.live (names escaped there)
      out.append(chart);
    }
    if (reply.command) out.append(el("pre", { class: "servebook-live-command" }, [reply.command]));
    if (reply.note) out.append(el("p", { class: "servebook-live-note" }, [reply.note]));
  }

  function request(container, calculator) {
    const req = { calculator };
    for (const field of container.querySelectorAll("[name]")) {
      if (field.name === "config_json") continue;
      req[field.name] = field.value;
    }
    if (req.model === PASTE) {
      delete req.model;
      req.config_json = container.querySelector("[name=config_json]").value;
    }
    return req;
  }

  async function start(container, button) {
    const calculator = container.dataset.calculator;
    const status = container.querySelector(".servebook-live-status");
    button.disabled = true;
    container.dataset.state = "loading";
    status.textContent = "Loading Python (Pyodide) and servebook from this site…";
    let rt;
    try {
      rt = await runtime();
    } catch (err) {
      container.dataset.state = "failed";
      status.textContent = `Could not start Python in this browser: ${err && err.message ? err.message : err}`;
      return;
    }
    if (!rt.options.calculators.includes(calculator)) {
      // An optional calculator whose modules did not import here (servebook.live.options()["unavailable"]).
      container.dataset.state = "unavailable";
      status.textContent = `Not available in the browser: ${rt.options.unavailable[calculator] || calculator}`;
      return;
    }
    const defaults = { ...rt.options.defaults, ...JSON.parse(container.dataset.defaults || "{}") };
    const form = el("form", { class: "servebook-live-form", autocomplete: "off" });
    for (const name of FIELDS[calculator]) {
      const label = (LABELS_FOR[calculator] || {})[name] || LABELS[name];
      form.append(el("label", {}, [el("span", {}, [label]), control(name, rt.options, defaults[name])]));
    }
    const paste = el("textarea", { name: "config_json", rows: "6", cols: "60", hidden: "",
                                   placeholder: "paste the model's config.json here" });
    form.append(paste);
    form.addEventListener("submit", (e) => e.preventDefault());
    container.querySelector(".servebook-live-controls").replaceChildren(form);
    const recompute = () => {
      paste.hidden = form.querySelector("[name=model]").value !== PASTE;
      const t0 = performance.now();
      const reply = JSON.parse(rt.live.compute_json(JSON.stringify(request(container, calculator))));
      render(container, reply);
      state.timings.last_compute_ms = performance.now() - t0;
      container.dataset.computations = String(Number(container.dataset.computations || 0) + 1);
    };
    const live = "Live: servebook " + rt.options.version + " running in this page (Python in WebAssembly).";
    if (SLOW.has(calculator)) {
      // Paint "searching" first, then compute (the search holds the page's one thread while it runs).
      form.addEventListener("change", () => {
        container.dataset.state = "computing";
        status.textContent = "Searching… (Python in this page)";
        setTimeout(() => {
          recompute();
          status.textContent = live;
          container.dataset.state = "ready";
        }, 30);
      });
    } else {
      form.addEventListener("input", recompute);
      form.addEventListener("change", recompute);
    }
    recompute();
    button.hidden = true;
    status.textContent = live;
    container.dataset.state = "ready";
  }

  function init() {
    for (const container of document.querySelectorAll(".servebook-live[data-calculator]")) {
      const button = container.querySelector("button.servebook-live-run");
      if (!button || !FIELDS[container.dataset.calculator]) continue;
      button.disabled = false;
      button.addEventListener("click", () => {
        state.timings.clicks += 1;
        start(container, button);
      });
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
