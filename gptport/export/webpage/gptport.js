// gptport in the browser: the bundle's model (the KV-cache graph of gptport's contract, fp32 or a gated
// int8/int4 variant: manifest.graph) on onnxruntime-web, the tokenizer on tokenizers.js (tokenizer.js), and
// the generation loop of `gptport generate`: the begin token first where the tokenizer adds one, prefill,
// then one token per step with the cache kept as the runtime's tensors, until any of the model's end tokens.
// Sampling mirrors gptport's (greedy, repetition penalty, temperature, top-k, top-p) with a seeded
// generator of its own: greedy output equals gptport's token for token; a seed reproduces a sampled run
// in the browser (its random numbers are not numpy's).
import { makeTokenizer } from "./tokenizer.js";

// onnxruntime-web's builds: the plain WebAssembly one decodes ~2x faster on the CPU than the WebGPU
// build's (asyncify) binary running the wasm provider, so each device loads its own.
const BUILDS = { wasm: "./runtime/ort.wasm.min.mjs", webgpu: "./runtime/ort.webgpu.min.mjs" };

const HERE = new URL(".", import.meta.url);

async function json(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

/** Load the bundle: manifest, tokenizer, and an inference session on `device` ("wasm" or "webgpu"). */
export async function load({ device = "wasm", threads = 0, base = HERE } = {}) {
  if (!(device in BUILDS)) throw new Error(`device ${device}: choose wasm or webgpu`);
  if (device === "webgpu" && !(navigator.gpu && (await navigator.gpu.requestAdapter()))) {
    throw new Error("device webgpu: this browser offers no WebGPU adapter");
  }
  const [manifest, tokJson] = await Promise.all(["manifest.json", "tokenizer.json"].map((f) => json(new URL(f, base))));
  const tokenizer = makeTokenizer(tokJson);
  const ort = await import(BUILDS[device]);
  ort.env.wasm.wasmPaths = new URL("runtime/", base).href;
  ort.env.logLevel = "error";  // onnxruntime's warnings (which nodes run on the CPU) reach the console as errors
  // Several wasm threads need cross-origin isolation (the COOP/COEP headers of `export-web --serve`).
  const most = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  ort.env.wasm.numThreads = threads > 0 ? Math.min(threads, most) : most;
  const { n_layer } = manifest.config;
  const presents = [];
  for (let i = 0; i < n_layer; i++) presents.push(`present.${i}.key`, `present.${i}.value`);
  const options = { executionProviders: [device], graphOptimizationLevel: "all", logSeverityLevel: 3 };
  if (device === "webgpu") {  // the cache stays on the GPU between steps; only the logits come back
    options.preferredOutputLocation = Object.fromEntries(presents.map((n) => [n, "gpu-buffer"]));
  }
  // A large model's weights lie beside its graph (manifest.external_data): each file fetched by onnxruntime-web
  // under the name the graph's tensors give it (its file name: they lie in the graph's folder).
  options.externalData = (manifest.external_data || []).map((f) => ({
    data: new URL(f, base).href, path: f.split("/").pop(),
  }));
  const session = await ort.InferenceSession.create(new URL(manifest.graph, base).href, options);
  return new Model(ort, session, tokenizer, manifest, device, ort.env.wasm.numThreads);
}

/** A seeded generator of uniform numbers in [0, 1) (mulberry32). */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** One token id from a row of logits: gptport's order of filters (penalty, temperature, top-k, top-p). */
export function choose(logits, { temperature = 0, top_k = 0, top_p = 1, repetition_penalty = 1 }, random, seen) {
  let row = logits;
  if (repetition_penalty !== 1) {
    row = Float32Array.from(logits);
    for (const id of new Set(seen)) row[id] = row[id] > 0 ? row[id] / repetition_penalty : row[id] * repetition_penalty;
  }
  if (temperature === 0) {
    let best = 0;
    for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
    return best;
  }
  const z = Float32Array.from(row, (x) => x / temperature);
  if (top_k > 0 && top_k < z.length) {
    const kth = Float32Array.from(z).sort()[z.length - top_k];
    for (let i = 0; i < z.length; i++) if (z[i] < kth) z[i] = -Infinity;
  }
  let max = -Infinity;
  for (const x of z) if (x > max) max = x;
  const p = Float64Array.from(z, (x) => Math.exp(x - max));
  if (top_p < 1) {  // the smallest set of likeliest tokens whose probability reaches top_p
    const order = Array.from(p.keys()).sort((a, b) => p[b] - p[a] || a - b);
    const total = p.reduce((s, x) => s + x, 0);
    let cumulative = 0, keep = order.length;
    for (let j = 0; j < order.length; j++) {
      cumulative += p[order[j]];
      if (cumulative >= top_p * total) { keep = j + 1; break; }
    }
    for (let j = keep; j < order.length; j++) p[order[j]] = 0;
  }
  const total = p.reduce((s, x) => s + x, 0);
  let target = random() * total;
  for (let i = 0; i < p.length; i++) {
    target -= p[i];
    if (target < 0 && p[i] > 0) return i;
  }
  for (let i = p.length - 1; i >= 0; i--) if (p[i] > 0) return i;  // rounding past the last token
  return 0;
}

export class Model {
  constructor(ort, session, tokenizer, manifest, device, threads) {
    Object.assign(this, { ort, session, tokenizer, manifest, device, threads });
    this.config = manifest.config;
    const { add_bos, bos_id, end_ids, eot_id } = this.config;
    this.start = add_bos ? [bos_id] : [];  // what every encoded prompt starts with
    this.ends = new Set(end_ids ?? [eot_id]);  // a bundle of an older gptport names <|endoftext|> alone
  }

  i64(values, dims) {
    return new this.ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims);
  }

  /** Token ids of `text`, as gptport's tokenizer gives them (no special tokens added). */
  encode(text) {
    return this.tokenizer.encode(text);
  }

  /** Text of token ids, special tokens included ("" for none). */
  decode(ids) {
    return this.tokenizer.decode(ids);
  }

  /** A prompt's ids as gptport encodes a prompt: the begin token first where the tokenizer adds one; an
   *  empty prompt is the begin token alone, or <|endoftext|> for a model without one. */
  promptIds(prompt) {
    const ids = [...this.start, ...this.encode(prompt)];
    return ids.length ? ids : [this.config.eot_id];
  }

  emptyPast() {
    const { n_layer, n_head, n_kv_head, head_dim } = this.config;
    const heads = n_kv_head || n_head;  // each key/value head shared by n_head / n_kv_head query heads
    const past = {};
    for (let i = 0; i < n_layer; i++) {
      for (const kv of ["key", "value"]) {
        past[`past_key_values.${i}.${kv}`] = new this.ort.Tensor("float32", new Float32Array(0), [1, heads, 0, head_dim]);
      }
    }
    return past;
  }

  /** One forward pass over `ids` after `cached` positions: the last position's logits (V,) and the cache. */
  async step(ids, cached, past) {
    const n = ids.length;
    const feeds = {
      input_ids: this.i64(ids, [1, n]),
      attention_mask: this.i64(new Array(cached + n).fill(1), [1, cached + n]),
      position_ids: this.i64(Array.from({ length: n }, (_, j) => cached + j), [1, n]),
      ...past,
    };
    const out = await this.session.run(feeds);
    const V = this.config.vocab_size;
    const logits = out.logits.data.slice((n - 1) * V, n * V);  // (V,) of the last position
    out.logits.dispose?.();
    const next = {};
    for (let i = 0; i < this.config.n_layer; i++) {
      for (const kv of ["key", "value"]) next[`past_key_values.${i}.${kv}`] = out[`present.${i}.${kv}`];
    }
    for (const t of Object.values(past)) if (t.location === "gpu-buffer") t.dispose();
    return { logits, past: next };
  }

  /**
   * Generate from `prompt`: {token_ids, text, finish_reason, prompt_tokens, ttft_ms, decode_tok_s}.
   * `ignore_eos` goes on past the end tokens (for measurements: every run makes max_new_tokens).
   * `onText(piece)` receives the text as it grows, whole characters only, stop strings held back; the
   * text is the decoding of all new tokens (a SentencePiece-style decoder's spaces depend on the tokens
   * before), so a token's text is what it adds to it.
   * finish_reason: eot (one of the model's end tokens), stop (a stop string), length (max_new_tokens),
   * context (the model's n_ctx is full), or abort (`signal`).
   */
  async generate(prompt, opts = {}, onText = () => {}) {
    const { max_new_tokens = 64, seed = 0, stop = [], signal, ignore_eos = false } = opts;
    const sampling = { temperature: opts.temperature ?? 0, top_k: opts.top_k ?? 0, top_p: opts.top_p ?? 1,
                       repetition_penalty: opts.repetition_penalty ?? 1 };
    const { n_ctx } = this.config;
    let promptIds = this.promptIds(prompt);
    if (promptIds.length > n_ctx) {  // as gptport generate: the last n_ctx tokens, the begin token kept
      promptIds = [...this.start, ...promptIds.slice(this.start.length - n_ctx)];
    }
    const random = rng(seed);
    const t0 = performance.now();
    let { logits, past } = await this.step(promptIds, 0, this.emptyPast());
    const ttft = performance.now() - t0;
    const ids = [];
    let shown = 0, finish = "length", text = "", tFirst = 0;
    while (true) {
      const tok = choose(logits, sampling, random, sampling.repetition_penalty !== 1 ? [...promptIds, ...ids] : []);
      if (this.ends.has(tok) && !ignore_eos) { finish = "eot"; break; }
      ids.push(tok);
      if (ids.length === 1) tFirst = performance.now();
      text = this.decode(ids);
      const hit = stop.map((s) => [text.indexOf(s), s]).filter(([i]) => i >= 0).sort((a, b) => a[0] - b[0])[0];
      if (hit) { text = text.slice(0, hit[0]); finish = "stop"; break; }
      const safe = safeLength(text, stop);
      if (safe > shown) { onText(text.slice(shown, safe)); shown = safe; }
      if (ids.length >= max_new_tokens) break;
      if (promptIds.length + ids.length >= n_ctx) { finish = "context"; break; }
      if (signal?.aborted) { finish = "abort"; break; }
      ({ logits, past } = await this.step([tok], promptIds.length + ids.length - 1, past));
    }
    for (const t of Object.values(past)) if (t.location === "gpu-buffer") t.dispose();
    if (finish !== "stop") text = this.decode(ids);
    if (text.length > shown) onText(text.slice(shown));
    const decodeS = (performance.now() - tFirst) / 1000;
    return { token_ids: ids, text, finish_reason: finish, prompt_tokens: promptIds.length, ttft_ms: ttft,
             decode_tok_s: ids.length > 1 && decodeS > 0 ? (ids.length - 1) / decodeS : null };
  }

  /** One of the manifest's greedy references generated again here: {prompt, ok, want, got}. */
  async checkOne(ref) {
    const r = await this.generate(ref.prompt, { max_new_tokens: ref.token_ids.length || 1 });
    const got = r.token_ids.slice(0, ref.token_ids.length);
    return { prompt: ref.prompt, ok: JSON.stringify(got) === JSON.stringify(ref.token_ids), want: ref.token_ids, got };
  }

  /** All of the manifest's references: [{prompt, ok, want, got}]. */
  async selfCheck() {
    const out = [];
    for (const ref of this.manifest.reference) out.push(await this.checkOne(ref));
    return out;
  }
}

/** How much of `text` can be shown: not a trailing U+FFFD (a character whose bytes are still coming),
 *  nor a tail that may yet grow into a stop string. */
function safeLength(text, stop) {
  let end = text.length;
  while (end > 0 && text[end - 1] === "\uFFFD") end--;
  for (const s of stop) {
    for (let k = Math.min(s.length - 1, end); k > 0; k--) {
      if (text.slice(end - k, end) === s.slice(0, k)) { end -= k; break; }
    }
  }
  return end;
}
