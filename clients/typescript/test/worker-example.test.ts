// 2. examples/worker.mjs (≤ 10 lines, importing the built package) as a subprocess: a handler
// that throws gets its message back (delivery_count 2); a handler that runs 3× the visibility
// timeout keeps its lease (heartbeats), nobody else gets the message meanwhile, its ack is 204;
// its ack, answered 503 + Retry-After by a proxy three times, is retried until 204 and the
// message not delivered again. (SIGTERM on this same example: sigterm.test.ts.)
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { EXAMPLE_PATH, allSettled, client, settledState, sleep, startExample, startProxy, uniqueTopic, until } from "./helpers.js";

const c = client();
const dir = mkdtempSync(`${process.env.TMPDIR ?? "/tmp"}/narad-ts-example-`);
after(() => rmSync(dir, { recursive: true, force: true }));

test("the example is at most 10 lines and imports the package", () => {
  const text = readFileSync(EXAMPLE_PATH, "utf8");
  const lines = text.split("\n").filter((l: string) => l.trim() !== "");
  assert.ok(lines.length <= 10, `examples/worker.mjs has ${lines.length} lines`);
  assert.match(text, /from "@narad\/client"/);
  // The client's README and the project's both show it as it is.
  for (const path of ["../README.md", "../../../README.md"]) {
    const readme = readFileSync(new URL(path, import.meta.url), "utf8");
    assert.ok(readme.includes("```js\n" + text + "```"), `${path} shows examples/worker.mjs as it is`);
  }
});

test("a handler that throws gets its message redelivered (delivery_count 2)", async () => {
  const topic = uniqueTopic("ex-throw");
  await c.createTopic(topic, { visibility_timeout_ms: 5000 });
  await c.produce(topic, { id: 1, fail_first: true });
  const w = startExample(topic, `${dir}/throw.out`);
  try {
    const line = await until("the job's line", 15_000, () => w.lines().find((l) => l.id === 1));
    assert.equal(line.delivery_count, 2, "the first delivery threw, the second one finished");
    assert.match(w.stderr(), /job 1 failed/);
    await until("the ack", 5000, async () => allSettled(await settledState(c, topic)));
  } finally {
    w.child.kill("SIGTERM");
  }
  const exit = await w.exited;
  assert.equal(exit.code, 0, w.stderr());
});

test("a handler that runs 3× the visibility timeout keeps its lease; its ack answers 204", async () => {
  const topic = uniqueTopic("ex-slow");
  const visibility = 1000;
  await c.createTopic(topic, { visibility_timeout_ms: visibility });
  const proxy = await startProxy(); // records what the worker sends and what the server answers
  const w = startExample(topic, `${dir}/slow.out`, proxy.url);
  try {
    // Let the worker start its long poll first, so it (not the competitor below) gets the job.
    await until("the worker's first consume", 10_000, () => proxy.seen.some((s) => s.url.includes("/consume")) || undefined);
    await c.produce(topic, { id: 2, sleep_ms: 3 * visibility + 500 });
    await until("the worker's lease", 5_000, () => proxy.seen.some((s) => s.url.includes("/consume") && s.status === 200) || undefined);
    const leasedAt = Date.now();
    // A competing consumer polls all along: the message must never come to it.
    let competitorGot = 0;
    while (!w.lines().some((l) => l.id === 2)) {
      const m = await c.consume(topic, { wait: 300 });
      if (m) {
        competitorGot++;
        await c.nack(topic, m.receipt_handle!);
      }
      assert.ok(Date.now() - leasedAt < 15_000, "the job never finished");
    }
    assert.equal(competitorGot, 0, "the message was redelivered to another consumer while its handler ran");
    const line = w.lines().find((l) => l.id === 2)!;
    assert.equal(line.delivery_count, 1);
    // The ack (a POST /ack without `extend`) answered 204; the heartbeats (extend=true) 204 too.
    const acks = await until("the ack", 5000, () => {
      const a = proxy.seen.filter((s) => s.url.includes("/ack?") && !s.url.includes("extend="));
      return a.length ? a : undefined;
    });
    assert.deepEqual(acks.map((a) => a.status), [204]);
    const beats = proxy.seen.filter((s) => s.url.includes("/ack?") && s.url.includes("extend=true"));
    assert.ok(beats.length >= 6, `expected a heartbeat every ~${visibility / 3} ms over ${3 * visibility + 500} ms, saw ${beats.length}`);
    assert.ok(beats.every((b) => b.status === 204), JSON.stringify(beats));
    assert.ok(allSettled(await settledState(c, topic)), JSON.stringify(await settledState(c, topic)));
    await sleep(visibility + 200);
    assert.equal(await c.consume(topic, { wait: 0 }), null, "acked: never delivered again");
  } finally {
    w.child.kill("SIGTERM");
    const exit = await w.exited;
    await proxy.close();
    assert.equal(exit.code, 0, w.stderr());
  }
});

test("an ack that meets 503 is retried until 204", async () => {
  const topic = uniqueTopic("ex-ack503");
  // The ~3 s of ack retries outlast the 1 s lease: the worker keeps heartbeating until the ack
  // is answered, so the fourth ack still finds the lease ours (a worker that stopped at the
  // handler's return got 410 here, and the message came back).
  const visibility = 1000;
  await c.createTopic(topic, { visibility_timeout_ms: visibility });
  const N = 3;
  let injected = 0;
  // The first N acks (POST /ack without `extend`) answer 503 + Retry-After: 1 + a JSON error;
  // heartbeats, consumes and everything else go through to the server.
  const proxy = await startProxy((method, url) => {
    if (method !== "POST" || !url.includes("/ack?") || url.includes("extend=") || injected >= N) return undefined;
    injected++;
    return {
      status: 503,
      headers: { "retry-after": "1" },
      body: JSON.stringify({ error: { code: "acked_ahead_full", message: "injected by the test proxy" } }),
    };
  });
  const w = startExample(topic, `${dir}/ack503.out`, proxy.url);
  try {
    await c.produce(topic, { id: 3 });
    const line = await until("the job's line", 15_000, () => w.lines().find((l) => l.id === 3));
    assert.equal(line.delivery_count, 1);
    const acks = () => proxy.seen.filter((s) => s.method === "POST" && s.url.includes("/ack?") && !s.url.includes("extend="));
    // Until an ack got something other than 503, or the worker gave up on the ack (it logs that).
    await until("the acks to end in a 204", 20_000, () => acks().some((a) => a.status !== 503 && a.status !== 0) || /\back of .*(failed|got 410)/.test(w.stderr()));
    assert.deepEqual(acks().map((a) => a.status), [503, 503, 503, 204], w.stderr());
    const [firstAck, acked] = [acks()[0].at, acks()[N].at];
    assert.ok(acked - firstAck >= (N - 1) * 1000, "Retry-After: 1 was honoured between the retries");
    await until("nothing unsettled", 5_000, async () => allSettled(await settledState(c, topic)));
    // Past the point where the lease (granted before the first ack) would have lapsed had the
    // ack been lost, the example (still polling) has not got the message again, nor anybody else.
    await sleep(Math.max(0, firstAck + visibility + 500 - Date.now()));
    assert.deepEqual(w.lines().map((l) => l.id), [3], "printed once: not delivered again");
    assert.equal(await c.consume(topic, { wait: 0 }), null, "acked: never delivered again");
    assert.ok(allSettled(await settledState(c, topic)), JSON.stringify(await settledState(c, topic)));
  } finally {
    w.child.kill("SIGTERM");
    const exit = await w.exited;
    await proxy.close();
    assert.equal(exit.code, 0, w.stderr());
  }
});

// SIGTERM on this same example is sigterm.test.ts.
