// 3. An ack that meets 503 is retried until 204: a real HTTP proxy between client and server
// answers the first N acks 503 + Retry-After: 1 + a JSON error, then forwards. Produce is
// retried only with an idempotency key.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client, NaradError } from "@narad/client";
import { PASS, USER, allSettled, client, settledState, sleep, startProxy, uniqueTopic } from "./helpers.js";

const direct = client();
const busy = (code: string) => ({
  status: 503,
  headers: { "retry-after": "1" },
  body: JSON.stringify({ error: { code, message: "injected by the test proxy" } }),
});

test("an ack answered 503 is retried after Retry-After until 204; the message is not redelivered", async () => {
  const topic = uniqueTopic("retry-ack");
  const visibility = 5000; // longer than the retries take, so no heartbeat is needed
  await direct.createTopic(topic, { visibility_timeout_ms: visibility });
  const N = 3;
  let injected = 0;
  const proxy = await startProxy((method, url) => {
    const isAck = method === "POST" && url.includes("/ack?") && !url.includes("extend=");
    if (isAck && injected < N) {
      injected++;
      return busy("acked_ahead_full");
    }
    return undefined;
  });
  try {
    const c = new Client({ baseUrl: proxy.url, user: USER, password: PASS });
    await c.produce(topic, { id: 1 });
    const m = (await c.consume(topic, { wait: 2000 }))!;
    assert.ok(m);
    const started = Date.now();
    await c.ack(topic, m.receipt_handle!); // resolves only on 204
    const elapsed = Date.now() - started;
    const acks = proxy.seen.filter((s) => s.url.includes("/ack?"));
    assert.deepEqual(acks.map((a) => a.status), [503, 503, 503, 204]);
    assert.ok(elapsed >= N * 1000, `Retry-After: 1 honoured ${N} times, yet the ack took ${elapsed} ms`);
    assert.ok(elapsed < N * 1000 + 5000, `the ack took ${elapsed} ms`);
    // Past the lease's visibility timeout, the message must not come back.
    await sleep(Math.max(0, started + visibility + 300 - Date.now()));
    assert.equal(await direct.consume(topic, { wait: 500 }), null);
    assert.ok(allSettled(await settledState(direct, topic)), JSON.stringify(await settledState(direct, topic)));
  } finally {
    await proxy.close();
  }
});

test("retries are bounded: an ack that keeps meeting 503 fails with the 503", async () => {
  const topic = uniqueTopic("retry-bound");
  await direct.createTopic(topic);
  const proxy = await startProxy((method, url) => (method === "POST" && url.includes("/ack?") ? { ...busy("busy"), headers: {} } : undefined));
  try {
    const c = new Client({ baseUrl: proxy.url, user: USER, password: PASS, retry: { maxAttempts: 3, baseDelayMs: 10 } });
    await c.produce(topic, "x");
    const m = (await c.consume(topic, { wait: 2000 }))!;
    await assert.rejects(c.ack(topic, m.receipt_handle!), (e: unknown) => e instanceof NaradError && e.status === 503 && e.code === "busy" && /injected/.test(e.message));
    assert.equal(proxy.seen.filter((s) => s.url.includes("/ack?")).length, 3);
  } finally {
    await proxy.close();
  }
});

test("produce is retried on 503 only with an idempotency key", async () => {
  const topic = uniqueTopic("retry-produce");
  await direct.createTopic(topic);
  let produces = 0;
  const proxy = await startProxy((method, url) => (method === "POST" && url.includes("/produce") && produces++ === 0 ? busy("storage_unavailable") : undefined));
  try {
    const c = new Client({ baseUrl: proxy.url, user: USER, password: PASS });
    await assert.rejects(c.produce(topic, "no key"), (e: unknown) => e instanceof NaradError && e.status === 503 && e.code === "storage_unavailable");
    assert.equal(proxy.seen.length, 1, "not retried");
    produces = 0;
    const p = await c.produce(topic, "keyed", { idempotencyKey: "k-1" });
    assert.deepEqual(proxy.seen.map((s) => s.status), [503, 503, 201]);
    const t = await direct.getTopic(topic);
    assert.equal(t.partitions.reduce((n, x) => n + x.next_offset, 0), 1, "one message appended");
    assert.equal((await direct.replay(topic, p.partition, p.offset)).payload, "keyed");
  } finally {
    await proxy.close();
  }
});
