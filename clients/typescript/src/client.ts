import { base64ToBytes, bytesToBase64 } from "./base64.js";
import { GoneError, NaradError } from "./errors.js";
import {
  OPERATIONS,
  type EntryResult,
  type Error as ErrorBody,
  type Headers as MessageHeaders,
  type Message,
  type OperationBodies,
  type OperationId,
  type OperationQueries,
  type OperationResults,
  type Produced,
  type SettingsInput,
  type SubscriptionInput,
} from "./openapi.js";

/**
 * The operations this client calls, operationId -> the method that calls it. The drift test
 * fails when the server's OpenAPI document has a /v1 operation missing here.
 */
export const IMPLEMENTED_OPERATIONS = {
  whoami: "whoami",
  listTopics: "listTopics",
  getTopic: "getTopic",
  createTopic: "createTopic",
  changeTopic: "changeTopic",
  deleteTopic: "deleteTopic",
  produce: "produce",
  produceBatch: "produceBatch",
  consume: "consume, consumeBatch, replay",
  consumeAcking: "consumeAcking",
  ack: "ack, extend, nack, retryLater, settleBatch",
  purgeTopic: "purgeTopic",
  redrive: "redrive",
  listSubscriptions: "listSubscriptions",
  getSubscription: "getSubscription",
  createSubscription: "createSubscription",
  patchSubscription: "patchSubscription",
  deleteSubscription: "deleteSubscription",
  cancelMessage: "cancelMessage",
} as const satisfies Partial<Record<OperationId, string>>;

/** A consumed or replayed message. A `payload_encoding: "base64"` payload is decoded to bytes. */
export interface NaradMessage<T = unknown> extends Omit<Message, "payload"> {
  /** JSON as parsed, text as a string, or (when `payload_encoding` is `"base64"`) a Uint8Array. */
  payload: T;
}

/** A duration: milliseconds, or Narad's syntax (`"500ms"`, `"30s"`, `"5m"`). */
export type Duration = number | string;

/** What a produce sends: bytes as they are, a string as UTF-8 text, anything else as JSON. */
export type Payload = Uint8Array | ArrayBuffer | string | number | boolean | null | object;

export interface RetryOptions {
  /** Attempts in all, the first included (default 10). 1: no retries. */
  maxAttempts?: number;
  /** The first backoff, doubled on each retry (default 100 ms). */
  baseDelayMs?: number;
  /** The longest backoff (default 15 s); a longer `Retry-After` is obeyed. */
  maxDelayMs?: number;
}

export interface ClientOptions {
  /** `http://127.0.0.1:8080`; a trailing slash is ignored. */
  baseUrl: string;
  user?: string;
  password?: string;
  /** Retries of 503, 429 and network errors (only for requests that are safe to repeat). */
  retry?: RetryOptions;
  /** Per-request timeout on top of a consume's `wait` (default 30 s). */
  timeoutMs?: number;
  /** Another fetch (tests, proxies, instrumentation); default globalThis.fetch. */
  fetch?: typeof fetch;
  /** Extra headers for every request. */
  headers?: Record<string, string>;
}

export interface CallOptions {
  /** Aborts the request (and its retries); the promise then rejects with the abort reason. */
  signal?: AbortSignal;
}

export interface ProduceOptions extends CallOptions {
  /** Routes by hash; returned on consume. */
  key?: string;
  partition?: number;
  /** Deliver no sooner than this (ms, or `"30s"`), up to 12 h. */
  delay?: Duration;
  /** With it the produce is retried on 503/429/network errors: a repeat appends nothing. */
  idempotencyKey?: string;
  /** Message headers (names `a-z0-9._-`), sent as `Narad-Header-<name>`. */
  headers?: Record<string, string>;
}

export interface BatchMessage {
  payload: Payload;
  key?: string | null;
  partition?: number | null;
  idempotencyKey?: string | null;
  headers?: MessageHeaders | null;
  delayMs?: number;
}

export interface ConsumeOptions extends CallOptions {
  /** Long-poll up to this long (ms or `"10s"`; the server caps it, 10 s by default). */
  wait?: Duration;
  partition?: number;
  /** A named subscription instead of the topic's default one. */
  subscription?: string;
}

export type Subscribed = { subscription?: string } & CallOptions;

/** How each settled handle went: `status` as a single request would have answered. */
export type SettleResult = EntryResult;

type Query = Record<string, string | number | boolean | undefined | null>;

interface Call {
  path?: Record<string, string | number>;
  query?: Query;
  body?: BodyInit | null;
  json?: unknown;
  headers?: Record<string, string>;
  /** Retry 503/429/network errors. */
  retry: boolean;
  signal?: AbortSignal;
  /** Extra time for a long poll. */
  extraTimeoutMs?: number;
}

interface Answer {
  status: number;
  headers: Headers;
  body: unknown;
}

/** The Narad HTTP API. Every method maps to one operation of the OpenAPI document. */
export class Client {
  readonly baseUrl: string;
  private readonly auth: string | undefined;
  private readonly retry: Required<RetryOptions>;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;
  private readonly extraHeaders: Record<string, string>;
  /** operationIds this client has called (the round-trip test checks it covers the API). */
  readonly calledOperations = new Set<OperationId>();

  constructor(options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    if (options.user !== undefined || options.password !== undefined) {
      const creds = new TextEncoder().encode(`${options.user ?? ""}:${options.password ?? ""}`);
      this.auth = `Basic ${bytesToBase64(creds)}`;
    }
    this.retry = {
      maxAttempts: options.retry?.maxAttempts ?? 10,
      baseDelayMs: options.retry?.baseDelayMs ?? 100,
      maxDelayMs: options.retry?.maxDelayMs ?? 15_000,
    };
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetchImpl = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.extraHeaders = options.headers ?? {};
  }

  // ---- identity ----

  /** The caller's user name and grants (`GET /v1/whoami`). */
  async whoami(options: CallOptions = {}): Promise<OperationResults["whoami"]> {
    return (await this.call("whoami", { retry: true, signal: options.signal })).body as OperationResults["whoami"];
  }

  // ---- topics ----

  /** One page of topics; pass `next` as `after` for the following one. */
  async listTopics(query: OperationQueries["listTopics"] = {}, options: CallOptions = {}): Promise<OperationResults["listTopics"]> {
    const a = await this.call("listTopics", { query: { ...query }, retry: true, signal: options.signal });
    return a.body as OperationResults["listTopics"];
  }

  /** Every topic the caller holds a grant on, page after page. */
  async *topics(options: CallOptions = {}): AsyncGenerator<OperationResults["listTopics"]["topics"][number]> {
    let after: string | undefined;
    for (;;) {
      const page = await this.listTopics(after === undefined ? {} : { after }, options);
      yield* page.topics;
      if (page.next == null) return;
      after = page.next;
    }
  }

  /** Creates a topic (201), or finds it with the same settings (200); other settings: 409. */
  async createTopic(topic: string, settings: SettingsInput = {}, options: CallOptions = {}): Promise<OperationResults["createTopic"] & { created: boolean }> {
    const a = await this.call("createTopic", { path: { topic }, json: settings satisfies OperationBodies["createTopic"], retry: true, signal: options.signal });
    return { ...(a.body as OperationResults["createTopic"]), created: a.status === 201 };
  }

  /** Settings and per-partition state. */
  async getTopic(topic: string, options: CallOptions = {}): Promise<OperationResults["getTopic"]> {
    return (await this.call("getTopic", { path: { topic }, retry: true, signal: options.signal })).body as OperationResults["getTopic"];
  }

  /** Changes the settings that can change. */
  async changeTopic(topic: string, settings: SettingsInput, options: CallOptions = {}): Promise<OperationResults["changeTopic"]> {
    const a = await this.call("changeTopic", { path: { topic }, json: settings satisfies OperationBodies["changeTopic"], retry: true, signal: options.signal });
    return a.body as OperationResults["changeTopic"];
  }

  /** Deletes a topic and every message in it. */
  async deleteTopic(topic: string, options: CallOptions = {}): Promise<void> {
    await this.call("deleteTopic", { path: { topic }, retry: true, signal: options.signal });
  }

  /** Removes every retained message (or, with `subscription`, settles them for it alone). */
  async purgeTopic(topic: string, options: Subscribed = {}): Promise<OperationResults["purgeTopic"]> {
    const a = await this.call("purgeTopic", { path: { topic }, query: { subscription: options.subscription }, retry: true, signal: options.signal });
    return a.body as OperationResults["purgeTopic"];
  }

  /** Moves up to `max` dead letters of this (dead-letter) topic back to their sources. */
  async redrive(topic: string, options: { max?: number } & CallOptions = {}): Promise<OperationResults["redrive"]> {
    const a = await this.call("redrive", { path: { topic }, query: { max: options.max }, retry: true, signal: options.signal });
    return a.body as OperationResults["redrive"];
  }

  // ---- subscriptions ----

  async listSubscriptions(topic: string, options: CallOptions = {}): Promise<OperationResults["listSubscriptions"]> {
    return (await this.call("listSubscriptions", { path: { topic }, retry: true, signal: options.signal })).body as OperationResults["listSubscriptions"];
  }

  async createSubscription(topic: string, subscription: string, input: SubscriptionInput = {}, options: CallOptions = {}): Promise<OperationResults["createSubscription"] & { created: boolean }> {
    const a = await this.call("createSubscription", { path: { topic, subscription }, json: input satisfies OperationBodies["createSubscription"], retry: true, signal: options.signal });
    return { ...(a.body as OperationResults["createSubscription"]), created: a.status === 201 };
  }

  async getSubscription(topic: string, subscription: string, options: CallOptions = {}): Promise<OperationResults["getSubscription"]> {
    return (await this.call("getSubscription", { path: { topic, subscription }, retry: true, signal: options.signal })).body as OperationResults["getSubscription"];
  }

  async patchSubscription(topic: string, subscription: string, input: SubscriptionInput, options: CallOptions = {}): Promise<OperationResults["patchSubscription"]> {
    const a = await this.call("patchSubscription", { path: { topic, subscription }, json: input satisfies OperationBodies["patchSubscription"], retry: true, signal: options.signal });
    return a.body as OperationResults["patchSubscription"];
  }

  async deleteSubscription(topic: string, subscription: string, options: CallOptions = {}): Promise<void> {
    await this.call("deleteSubscription", { path: { topic, subscription }, retry: true, signal: options.signal });
  }

  // ---- producing ----

  /**
   * Appends one message. Retried on 503/429/network errors only with `idempotencyKey` (a
   * repeat then appends nothing); without one, a failure is thrown at once.
   */
  async produce(topic: string, payload: Payload, options: ProduceOptions = {}): Promise<Produced> {
    const { body, contentType } = encodePayload(payload);
    const headers: Record<string, string> = { "content-type": contentType };
    if (options.idempotencyKey !== undefined) headers["idempotency-key"] = options.idempotencyKey;
    for (const [name, value] of Object.entries(options.headers ?? {})) headers[`narad-header-${name}`] = value;
    const query: OperationQueries["produce"] = {
      key: options.key,
      partition: options.partition,
      delay: options.delay === undefined ? undefined : duration(options.delay),
    };
    const a = await this.call("produce", {
      path: { topic },
      query,
      body,
      headers,
      retry: options.idempotencyKey !== undefined,
      signal: options.signal,
    });
    return a.body as OperationResults["produce"];
  }

  /**
   * Appends up to 1000 messages; one result per message, in order. Retried on 503/429/network
   * errors only when every message has an idempotency key.
   */
  async produceBatch(topic: string, messages: BatchMessage[], options: CallOptions = {}): Promise<SettleResult[]> {
    const wire: OperationBodies["produceBatch"] = {
      messages: messages.map((m) => {
        const entry: OperationBodies["produceBatch"]["messages"][number] = { payload: m.payload };
        if (m.payload instanceof Uint8Array || m.payload instanceof ArrayBuffer) {
          entry.payload = bytesToBase64(m.payload instanceof Uint8Array ? m.payload : new Uint8Array(m.payload));
          entry.payload_encoding = "base64";
        }
        if (m.key != null) entry.key = m.key;
        if (m.partition != null) entry.partition = m.partition;
        if (m.idempotencyKey != null) entry.idempotency_key = m.idempotencyKey;
        if (m.headers != null) entry.headers = m.headers;
        if (m.delayMs !== undefined) entry.delay_ms = m.delayMs;
        return entry;
      }),
    };
    const retry = messages.length > 0 && messages.every((m) => m.idempotencyKey != null);
    const a = await this.call("produceBatch", { path: { topic }, json: wire, retry, signal: options.signal });
    return (a.body as OperationResults["produceBatch"]).results;
  }

  // ---- consuming ----

  /** Leases one message, long-polling up to `wait`; null when none turned up. */
  async consume<T = unknown>(topic: string, options: ConsumeOptions = {}): Promise<NaradMessage<T> | null> {
    const a = await this.call("consume", this.consumeCall(topic, options, undefined));
    if (a.status === 204) return null;
    return decodeMessage(a.body as Message) as NaradMessage<T>;
  }

  /** Leases up to `max` (≤ 100) messages, long-polling up to `wait`; [] when none turned up. */
  async consumeBatch<T = unknown>(topic: string, max: number, options: ConsumeOptions = {}): Promise<NaradMessage<T>[]> {
    const a = await this.call("consume", this.consumeCall(topic, options, max));
    if (a.status === 204) return [];
    const body = a.body as OperationResults["consume"];
    const list = body && "messages" in body ? body.messages : body ? [body as Message] : [];
    return list.map((m) => decodeMessage(m) as NaradMessage<T>);
  }

  /**
   * Acks `ack` and leases up to `max` (default 1) next messages in one request. `acks` has one
   * result per handle, in order: 204 acked, 410 gone, 503 unknown (ack it again).
   */
  async consumeAcking<T = unknown>(
    topic: string,
    ack: string[],
    options: ConsumeOptions & { max?: number } = {},
  ): Promise<{ messages: NaradMessage<T>[]; acks: SettleResult[] }> {
    const call = this.consumeCall(topic, options, options.max);
    call.json = { ack } satisfies OperationBodies["consumeAcking"];
    const a = await this.call("consumeAcking", call);
    const body = a.body as OperationResults["consumeAcking"];
    return { messages: body.messages.map((m) => decodeMessage(m) as NaradMessage<T>), acks: body.acks };
  }

  /** Reads a retained message by position: read-only, no lease, no receipt handle. */
  async replay<T = unknown>(topic: string, partition: number, offset: number, options: CallOptions = {}): Promise<NaradMessage<T>> {
    const query: OperationQueries["consume"] = { partition, offset };
    const a = await this.call("consume", { path: { topic }, query: { ...query }, retry: true, signal: options.signal });
    return decodeMessage(a.body as Message) as NaradMessage<T>;
  }

  private consumeCall(topic: string, options: ConsumeOptions, max: number | undefined): Call {
    const query: OperationQueries["consume"] = {
      wait: options.wait === undefined ? undefined : duration(options.wait),
      partition: options.partition,
      max,
      subscription: options.subscription,
    };
    const waitMs = options.wait === undefined ? 0 : durationMs(options.wait);
    return { path: { topic }, query: { ...query }, retry: true, signal: options.signal, extraTimeoutMs: waitMs };
  }

  // ---- settling ----

  /** Acks a lease (204). A lease that is no longer yours throws GoneError (410): move on. */
  async ack(topic: string, receiptHandle: string, options: CallOptions = {}): Promise<void> {
    await this.settle(topic, receiptHandle, undefined, options);
  }

  /** Renews the lease for the visibility timeout from now (a heartbeat). */
  async extend(topic: string, receiptHandle: string, options: CallOptions = {}): Promise<void> {
    await this.settle(topic, receiptHandle, "true", options);
  }

  /** Gives the message back now (extend=0): it is redelivered at once. */
  async nack(topic: string, receiptHandle: string, options: CallOptions = {}): Promise<void> {
    await this.settle(topic, receiptHandle, "0", options);
  }

  /** Retry later: the lease ends `delay` from now (up to 12 h), and the message comes back then. */
  async retryLater(topic: string, receiptHandle: string, delay: Duration, options: CallOptions = {}): Promise<void> {
    await this.settle(topic, receiptHandle, duration(delay), options);
  }

  private async settle(topic: string, receiptHandle: string, extend: string | undefined, options: CallOptions): Promise<void> {
    const query: OperationQueries["ack"] = { receipt_handle: receiptHandle, extend };
    await this.call("ack", { path: { topic }, query: { ...query }, retry: true, signal: options.signal });
  }

  /**
   * Settles many handles in one request: ack (no `extend`), heartbeat (`true`), nack (`0`) or
   * retry later (a duration). One result per handle, in order. Entries answered 503 are sent
   * again with backoff (bounded); 410 entries are returned as they are.
   */
  async settleBatch(
    topic: string,
    receiptHandles: string[],
    options: { extend?: true | 0 | Duration } & CallOptions = {},
  ): Promise<SettleResult[]> {
    const results: SettleResult[] = new Array(receiptHandles.length);
    let pending = receiptHandles.map((_, i) => i);
    const extend = options.extend === undefined ? undefined : options.extend === true ? true : options.extend === 0 ? 0 : duration(options.extend);
    for (let attempt = 0; pending.length; attempt++) {
      const body: OperationBodies["ack"] = { receipt_handles: pending.map((i) => receiptHandles[i]) };
      if (extend !== undefined) body.extend = extend;
      const a = await this.call("ack", { path: { topic }, json: body, retry: true, signal: options.signal });
      const got = (a.body as Exclude<OperationResults["ack"], undefined>).results;
      const again: number[] = [];
      pending.forEach((index, k) => {
        results[index] = got[k];
        if (got[k].status === 503 || got[k].status === 429) again.push(index);
      });
      pending = again;
      if (!pending.length || attempt + 1 >= this.retry.maxAttempts) break;
      await sleep(this.backoffMs(attempt, undefined), options.signal);
    }
    return results;
  }

  // ---- messages ----

  /** Cancels one retained message for every subscription (or one): 204; not retained: 404. */
  async cancelMessage(topic: string, partition: number, offset: number, options: Subscribed = {}): Promise<void> {
    await this.call("cancelMessage", { path: { topic, partition, offset }, query: { subscription: options.subscription }, retry: true, signal: options.signal });
  }

  // ---- transport ----

  private backoffMs(attempt: number, retryAfterMs: number | undefined): number {
    const expo = Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** attempt);
    const jittered = expo / 2 + (Math.random() * expo) / 2;
    if (retryAfterMs === undefined) return jittered;
    // Never sooner than the server asked; spread the herd a little beyond it.
    return Math.max(retryAfterMs, jittered) + Math.random() * Math.min(1000, expo);
  }

  private async call(operation: OperationId, call: Call): Promise<Answer> {
    this.calledOperations.add(operation);
    const op = OPERATIONS[operation];
    const path = op.path.replace(/\{(\w+)\}/g, (_, name: string) => {
      const value = call.path?.[name];
      if (value === undefined) throw new TypeError(`${operation}: missing path parameter ${name}`);
      return encodeURIComponent(String(value));
    });
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(call.query ?? {})) if (v !== undefined && v !== null) search.set(k, String(v));
    const url = `${this.baseUrl}${path}${search.toString() ? `?${search}` : ""}`;
    const headers: Record<string, string> = { ...this.extraHeaders, ...(call.headers ?? {}) };
    if (this.auth) headers.authorization = this.auth;
    let body = call.body ?? null;
    if (call.json !== undefined) {
      body = JSON.stringify(call.json);
      headers["content-type"] = "application/json";
    }
    const attempts = call.retry ? Math.max(1, this.retry.maxAttempts) : 1;
    for (let attempt = 0; ; attempt++) {
      let error: NaradError;
      try {
        const answer = await this.once(operation, op.method, url, headers, body, call);
        if (answer.status < 300) return answer;
        error = toError(operation, answer);
      } catch (e) {
        if (call.signal?.aborted) throw call.signal.reason ?? e;
        if (e instanceof NaradError) throw e;
        error = new NaradError(0, "network_error", `${operation}: ${(e as Error)?.message ?? e}`, { operation, cause: e });
      }
      if (!error.retryable || attempt + 1 >= attempts) throw error;
      await sleep(this.backoffMs(attempt, error.retryAfterMs), call.signal);
    }
  }

  private async once(operation: string, method: string, url: string, headers: Record<string, string>, body: BodyInit | null, call: Call): Promise<Answer> {
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(new Error(`${operation}: no answer within the timeout`)), this.timeoutMs + (call.extraTimeoutMs ?? 0));
    const onAbort = () => timeout.abort(call.signal?.reason);
    call.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const res = await this.fetchImpl(url, { method, headers, body, signal: timeout.signal });
      const text = await res.text();
      let parsed: unknown = undefined;
      if (text.length) {
        try {
          parsed = JSON.parse(text);
        } catch {
          parsed = text;
        }
      }
      return { status: res.status, headers: res.headers, body: parsed };
    } finally {
      clearTimeout(timer);
      call.signal?.removeEventListener("abort", onAbort);
    }
  }
}

function toError(operation: string, answer: Answer): NaradError {
  const err = (answer.body as Partial<ErrorBody> | undefined)?.error;
  const code = typeof err?.code === "string" ? err.code : `http_${answer.status}`;
  const message = typeof err?.message === "string" ? err.message : `HTTP ${answer.status}`;
  const init = {
    operation,
    requestId: answer.headers.get("x-request-id") ?? undefined,
    retryAfterMs: retryAfterMs(answer.headers.get("retry-after")),
  };
  const full = `${operation}: ${answer.status} ${code}: ${message}`;
  return answer.status === 410 ? new GoneError(code, full, init) : new NaradError(answer.status, code, full, init);
}

function retryAfterMs(value: string | null): number | undefined {
  if (value === null) return undefined;
  if (/^\s*\d+\s*$/.test(value)) return Number(value) * 1000;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}

/** Decodes `payload_encoding: "base64"` payloads to bytes. */
export function decodeMessage(message: Message): NaradMessage {
  if (message.payload_encoding === "base64" && typeof message.payload === "string") {
    return { ...message, payload: base64ToBytes(message.payload) };
  }
  return message as NaradMessage;
}

function encodePayload(payload: Payload): { body: BodyInit; contentType: string } {
  if (payload instanceof Uint8Array) return { body: payload as unknown as BodyInit, contentType: "application/octet-stream" };
  if (payload instanceof ArrayBuffer) return { body: new Uint8Array(payload), contentType: "application/octet-stream" };
  if (typeof payload === "string") return { body: payload, contentType: "text/plain; charset=utf-8" };
  return { body: JSON.stringify(payload), contentType: "application/json" };
}

/** Narad's duration syntax: a number of milliseconds becomes `"<n>ms"`. */
export function duration(d: Duration): string {
  if (typeof d === "number") {
    if (!Number.isFinite(d) || d < 0) throw new RangeError(`bad duration ${d}`);
    return `${Math.round(d)}ms`;
  }
  return d;
}

function durationMs(d: Duration): number {
  if (typeof d === "number") return d;
  const m = /^\s*(\d+)\s*(ms|s|m|h)?\s*$/.exec(d);
  if (!m) return 0;
  const n = Number(m[1]);
  return m[2] === "ms" ? n : m[2] === "m" ? n * 60_000 : m[2] === "h" ? n * 3_600_000 : n * 1000;
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
