// The Worker in process: batch mode, 410 logged and skipped, the stop timeout nacks.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Worker, type Logger, type NaradMessage } from "@narad/client";
import { allSettled, client, settledState, sleep, uniqueTopic, until } from "./helpers.js";

const c = client();

function capture(): Logger & { lines: string[] } {
  const lines: string[] = [];
  const put = (...args: unknown[]) => void lines.push(args.map(String).join(" "));
  return { lines, info: put, warn: put, error: put };
}

test("batch mode: leases up to batchSize at once, acks what resolved, gives back what threw", async () => {
  const topic = uniqueTopic("w-batch");
  await c.createTopic(topic, { visibility_timeout_ms: 3000 });
  const M = 12;
  await c.produceBatch(topic, Array.from({ length: M }, (_, id) => ({ payload: { id } })));
  const seen: Array<{ id: number; delivery: number }> = [];
  let largest = 0;
  let inHand = 0;
  const log = capture();
  const worker = new Worker<{ id: number }>(
    c,
    topic,
    async (m) => {
      inHand++;
      largest = Math.max(largest, inHand);
      await sleep(50);
      inHand--;
      seen.push({ id: m.payload.id, delivery: m.delivery_count });
      if (m.payload.id === 3 && m.delivery_count === 1) throw new Error("first try of 3 fails");
    },
    { batchSize: 5, wait: "1s", logger: log },
  );
  const run = worker.run();
  await until("every job done once, and 3 twice", 15_000, () => seen.length === M + 1);
  await until("all acked", 5_000, async () => allSettled(await settledState(c, topic)));
  await worker.stop();
  await run;
  assert.ok(largest > 1 && largest <= 5, `handlers in hand at once: ${largest}`);
  assert.deepEqual(seen.filter((s) => s.id === 3).map((s) => s.delivery), [1, 2]);
  assert.ok(log.lines.some((l) => /first try of 3 fails/.test(l)), log.lines.join("\n"));
});

test("an ack that gets 410 is logged and skipped; the worker goes on", async () => {
  const topic = uniqueTopic("w-gone");
  await c.createTopic(topic, { visibility_timeout_ms: 300 });
  await c.produce(topic, { n: 1 }, { partition: 0 });
  const log = capture();
  const deliveries: number[] = [];
  // No heartbeat for a minute: the first handler outlives its lease, which then goes to the
  // second delivery; the first ack gets 410.
  const worker = new Worker<{ n: number }>(
    c,
    topic,
    async (m: NaradMessage<{ n: number }>) => {
      deliveries.push(m.delivery_count);
      if (m.delivery_count === 1) await sleep(900);
    },
    { heartbeatMs: 60_000, wait: "200ms", logger: log },
  );
  const run = worker.run();
  await until("the 410 in the log", 10_000, () => log.lines.some((l) => /410/.test(l)));
  await until("settled", 10_000, async () => allSettled(await settledState(c, topic)));
  await worker.stop();
  await run;
  assert.ok(deliveries.includes(2), `deliveries: ${deliveries}`);
  assert.ok(log.lines.some((l) => /ack of .* got 410/.test(l)), log.lines.join("\n"));
});

test("stop(): a handler still running after stopTimeoutMs has its message given back at once", async () => {
  const topic = uniqueTopic("w-stop");
  await c.createTopic(topic, { visibility_timeout_ms: 30_000 });
  await c.produce(topic, "stuck");
  let aborted = false;
  let started = false;
  const worker = new Worker(
    c,
    topic,
    (_m, ctx) =>
      new Promise<void>((resolve) => {
        started = true;
        ctx.signal.addEventListener("abort", () => {
          aborted = true;
          resolve();
        });
      }),
    { stopTimeoutMs: 300, logger: capture() },
  );
  const run = worker.run();
  await until("the handler", 5_000, () => started);
  const t0 = Date.now();
  await worker.stop();
  await run;
  const took = Date.now() - t0;
  assert.ok(took >= 300 && took < 2000, `stop took ${took} ms`);
  assert.ok(aborted, "the handler's signal was aborted");
  // Nacked, not left to its 30 s lease: available again right away, delivery_count 2.
  const again = (await c.consume(topic, { wait: 1000 }))!;
  assert.ok(again, "given back at once");
  assert.equal(again.delivery_count, 2);
  await c.ack(topic, again.receipt_handle!);
});
