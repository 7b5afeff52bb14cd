import { Client, sleep, type Duration, type NaradMessage } from "./client.js";
import { NaradError } from "./errors.js";

export interface WorkerContext {
  /** Aborted when the lease is lost (a heartbeat got 410) or the stop timeout passed: give up. */
  signal: AbortSignal;
}

export type Handler<T = unknown> = (message: NaradMessage<T>, context: WorkerContext) => unknown | Promise<unknown>;

export interface Logger {
  info(...args: unknown[]): void;
  warn(...args: unknown[]): void;
  error(...args: unknown[]): void;
}

export interface WorkerOptions {
  /** Consume for this subscription instead of the topic's default one. */
  subscription?: string;
  /** Long-poll wait of each consume (default `"10s"`; the server caps it). */
  wait?: Duration;
  /**
   * Batch mode when > 1: lease up to this many (≤ 100) per consume, run the handler on each
   * concurrently, heartbeat and settle them with batch requests. Default 1.
   */
  batchSize?: number;
  /** Heartbeat period; default a third of the (subscription's) visibility_timeout_ms. */
  heartbeatMs?: number;
  /** After stop(), how long in-flight handlers may still run before their messages are nacked (default 30 s). */
  stopTimeoutMs?: number;
  /** Stops the worker when aborted (like stop()). */
  signal?: AbortSignal;
  /** Default: console, everything on stderr (console.warn/console.error), stdout left to the program. */
  logger?: Logger;
}

interface Lease<T> {
  message: NaradMessage<T>;
  handle: string;
  control: AbortController;
  /** The handler finished (or was abandoned at the stop timeout). */
  done: boolean;
  /** Acked or nacked: the heartbeat leaves it alone from then on. */
  settled: boolean;
  lost: boolean;
}

type Outcome = "ok" | "failed" | "abandoned";

/**
 * The consumer loop: long-poll consume, run the handler while heartbeating the lease, ack when
 * it resolves, nack (extend=0) when it throws; 410 is logged and skipped. stop() finishes the
 * message in hand (ack) and resolves run(); past stopTimeoutMs the message is nacked instead.
 */
export class Worker<T = unknown> {
  private readonly options: WorkerOptions;
  private readonly log: Logger;
  private stopping = false;
  private readonly poll = new AbortController();
  private deadlineTimer: ReturnType<typeof setTimeout> | undefined;
  private deadlinePassed = false;
  private readonly deadlineListeners = new Set<() => void>();
  private running: Promise<void> | undefined;
  private finished = false;
  private signalCleanup: (() => void) | undefined;

  constructor(
    readonly client: Client,
    readonly topic: string,
    private readonly handler: Handler<T>,
    options: WorkerOptions = {},
  ) {
    this.options = options;
    this.log = options.logger ?? stderrLogger;
    options.signal?.addEventListener("abort", () => void this.stop(), { once: true });
    if (options.signal?.aborted) this.stopping = true;
  }

  /** Runs until stop(); rejects on an error that retrying cannot fix (401, 403, 404, 400). */
  run(): Promise<void> {
    if (!this.running) {
      this.running = this.loop().finally(() => {
        this.finished = true;
        if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
        this.signalCleanup?.();
      });
    }
    return this.running;
  }

  /** Stops consuming, lets the message in hand finish (then acks it), and resolves when done. */
  stop(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      this.poll.abort(new Error("worker stopping"));
    }
    if (this.running && !this.finished && this.deadlineTimer === undefined) {
      this.deadlineTimer = setTimeout(() => {
        this.deadlinePassed = true;
        for (const listener of this.deadlineListeners) listener();
      }, this.options.stopTimeoutMs ?? 30_000);
    }
    return this.running ?? Promise.resolve();
  }

  get stopped(): boolean {
    return this.stopping;
  }

  /**
   * Installs SIGTERM and SIGINT handlers that call stop(), where there is a process to signal
   * (Node, Bun; Deno's `process` too). Elsewhere (Workers, browsers) it does nothing. The
   * handlers are removed when run() ends, so the process can then exit normally.
   */
  stopOnSignals(signals: string[] = ["SIGTERM", "SIGINT"]): this {
    const proc = (globalThis as { process?: { on?: Function; off?: Function; removeListener?: Function } }).process;
    if (!proc || typeof proc.on !== "function" || this.signalCleanup) return this;
    const onSignal = (signal: string) => {
      this.log.info(`[narad worker] ${signal}: stopping after the message in hand`);
      void this.stop();
    };
    for (const s of signals) proc.on.call(proc, s, onSignal);
    this.signalCleanup = () => {
      const off = proc.off ?? proc.removeListener;
      for (const s of signals) off?.call(proc, s, onSignal);
      this.signalCleanup = undefined;
    };
    return this;
  }

  private async loop(): Promise<void> {
    if (this.stopping) return;
    let heartbeatMs = this.options.heartbeatMs;
    if (heartbeatMs === undefined) {
      const visibility = this.options.subscription
        ? (await this.client.getSubscription(this.topic, this.options.subscription)).effective.visibility_timeout_ms
        : (await this.client.getTopic(this.topic)).settings.visibility_timeout_ms;
      heartbeatMs = Math.max(20, Math.floor(visibility / 3));
    }
    const batchSize = Math.min(100, Math.max(1, this.options.batchSize ?? 1));
    const consumeOptions = { wait: this.options.wait ?? "10s", subscription: this.options.subscription, signal: this.poll.signal };
    let failures = 0;
    while (!this.stopping) {
      let messages: NaradMessage<T>[];
      try {
        if (batchSize > 1) {
          messages = await this.client.consumeBatch<T>(this.topic, batchSize, consumeOptions);
        } else {
          const m = await this.client.consume<T>(this.topic, consumeOptions);
          messages = m ? [m] : [];
        }
        failures = 0;
      } catch (e) {
        if (this.stopping) break;
        if (e instanceof NaradError && !e.retryable && e.status < 500 && e.status !== 408) throw e;
        failures++;
        this.log.error(`[narad worker] consume on ${this.topic} failed, trying again:`, e);
        try {
          await sleep(Math.min(30_000, 500 * 2 ** Math.min(failures, 6)), this.poll.signal);
        } catch {
          break;
        }
        continue;
      }
      if (messages.length) await this.process(messages, heartbeatMs);
    }
  }

  private async process(messages: NaradMessage<T>[], heartbeatMs: number): Promise<void> {
    const leases: Lease<T>[] = messages.map((message) => ({
      message,
      handle: message.receipt_handle ?? "",
      control: new AbortController(),
      done: false,
      settled: false,
      lost: false,
    }));
    // The heartbeat runs until each lease is settled, not only while its handler runs: an
    // ack retried after 503s for longer than the visibility timeout still finds it ours.
    const stopHeartbeat = this.heartbeat(leases, heartbeatMs);
    try {
      if (leases.length === 1) {
        const outcome = await this.handle(leases[0]);
        await this.settleOne(leases[0], outcome);
      } else {
        const outcomes = await Promise.all(leases.map((l) => this.handle(l)));
        await this.settleMany(leases, outcomes);
      }
    } finally {
      stopHeartbeat();
    }
  }

  /** Runs the handler; against the stop deadline once stop() was called. */
  private async handle(lease: Lease<T>): Promise<Outcome> {
    const work = (async (): Promise<Outcome> => {
      try {
        await this.handler(lease.message, { signal: lease.control.signal });
        return "ok";
      } catch (e) {
        this.log.warn(`[narad worker] handler failed on ${describe(lease.message)}; giving it back:`, e);
        return "failed";
      }
    })();
    let onDeadline = () => {};
    const deadline = new Promise<"deadline">((resolve) => {
      onDeadline = () => resolve("deadline");
    });
    if (this.deadlinePassed) onDeadline();
    else this.deadlineListeners.add(onDeadline);
    let raced: Outcome | "deadline";
    try {
      raced = await Promise.race([work, deadline]);
    } finally {
      this.deadlineListeners.delete(onDeadline);
    }
    lease.done = true;
    if (raced === "deadline") {
      lease.control.abort(new Error("worker stop timeout"));
      this.log.warn(`[narad worker] stop timeout: giving back ${describe(lease.message)} unfinished`);
      return "abandoned";
    }
    return raced;
  }

  /**
   * Extends every unsettled lease every heartbeatMs; a 410 marks it lost and aborts its
   * handler (once the handler is done, a 410 is left to the ack, which may have raced it).
   */
  private heartbeat(leases: Lease<T>[], heartbeatMs: number): () => void {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const beat = async () => {
      const live = leases.filter((l) => !l.settled && !l.lost);
      if (!live.length) return;
      try {
        if (live.length === 1) {
          try {
            await this.client.extend(this.topic, live[0].handle);
          } catch (e) {
            if (e instanceof NaradError && e.gone) this.lose(live[0]);
            else throw e;
          }
        } else {
          const results = await this.client.settleBatch(this.topic, live.map((l) => l.handle), { extend: true });
          results.forEach((r, i) => {
            if (r.status === 410) this.lose(live[i]);
          });
        }
      } catch (e) {
        this.log.warn(`[narad worker] heartbeat on ${this.topic} failed (will try again):`, e);
      }
    };
    const schedule = () => {
      if (stopped) return;
      timer = setTimeout(async () => {
        await beat();
        schedule();
      }, heartbeatMs);
    };
    schedule();
    return () => {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
    };
  }

  private lose(lease: Lease<T>): void {
    if (lease.done || lease.lost) return;
    lease.lost = true;
    this.log.warn(`[narad worker] lease lost (410) on ${describe(lease.message)}: it belongs to another consumer now`);
    lease.control.abort(new Error("lease lost"));
  }

  private async settleOne(lease: Lease<T>, outcome: Outcome): Promise<void> {
    if (lease.lost) return;
    try {
      if (outcome === "ok") await this.client.ack(this.topic, lease.handle);
      else await this.client.nack(this.topic, lease.handle);
    } catch (e) {
      this.reportSettleError(lease, outcome, e);
    } finally {
      lease.settled = true;
    }
  }

  private async settleMany(leases: Lease<T>[], outcomes: Outcome[]): Promise<void> {
    const acks = leases.filter((l, i) => !l.lost && outcomes[i] === "ok");
    const nacks = leases.filter((l, i) => !l.lost && outcomes[i] !== "ok");
    for (const [group, extend] of [[acks, undefined], [nacks, 0]] as const) {
      if (!group.length) continue;
      try {
        const results = await this.client.settleBatch(this.topic, group.map((l) => l.handle), extend === undefined ? {} : { extend });
        results.forEach((r, i) => {
          if (r.status === 410) this.log.warn(`[narad worker] 410 settling ${describe(group[i].message)}: skipped`);
          else if (r.status >= 300) this.log.error(`[narad worker] settling ${describe(group[i].message)} answered ${r.status}`, r.error);
        });
      } catch (e) {
        for (const l of group) this.reportSettleError(l, extend === undefined ? "ok" : "failed", e);
      } finally {
        for (const l of group) l.settled = true;
      }
    }
  }

  private reportSettleError(lease: Lease<T>, outcome: Outcome, e: unknown): void {
    const what = outcome === "ok" ? "ack" : "nack";
    if (e instanceof NaradError && e.gone) {
      this.log.warn(`[narad worker] ${what} of ${describe(lease.message)} got 410 (the lease lapsed): skipped`);
    } else {
      this.log.error(`[narad worker] ${what} of ${describe(lease.message)} failed; it will be redelivered:`, e);
    }
  }
}

const stderrLogger: Logger = {
  info: (...args) => console.warn(...args),
  warn: (...args) => console.warn(...args),
  error: (...args) => console.error(...args),
};

function describe(m: NaradMessage<unknown>): string {
  return `${m.topic}/${m.partition}/${m.offset} (delivery ${m.delivery_count})`;
}
