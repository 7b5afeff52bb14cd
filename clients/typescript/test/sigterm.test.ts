// 4. SIGTERM stops the example worker without losing a message: M slow jobs, SIGTERM while a
// handler runs, a prompt exit 0 with that job finished and acked; a second worker drains the
// rest; every job processed at least once and nothing left unacked.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { allSettled, client, settledState, startExample, uniqueTopic, until } from "./helpers.js";

const c = client();
const dir = mkdtempSync(`${process.env.TMPDIR ?? "/tmp"}/narad-ts-sigterm-`);
after(() => rmSync(dir, { recursive: true, force: true }));

test("SIGTERM mid-handler: exit 0 promptly, the job in hand finished and acked, nothing lost", async () => {
  const topic = uniqueTopic("sigterm");
  const M = 8;
  const jobMs = 800;
  await c.createTopic(topic, { partitions: 2, visibility_timeout_ms: 10_000 });
  const results = await c.produceBatch(topic, Array.from({ length: M }, (_, id) => ({ payload: { id, sleep_ms: jobMs } })));
  assert.ok(results.every((r) => r.status === 201));

  const first = startExample(topic, `${dir}/first.out`);
  let firstLines: number;
  let exit: { code: number | null; signal: string | null; at: number };
  let signalledAt: number;
  try {
    // Two jobs done, and the third one's handler is running (well inside its 800 ms sleep).
    await until("two jobs", 15_000, () => first.lines().length >= 2);
    await new Promise((r) => setTimeout(r, jobMs / 3));
    firstLines = first.lines().length;
    assert.equal(firstLines, 2, "the third job must still be running");
    signalledAt = Date.now();
    first.child.kill("SIGTERM");
    exit = await first.exited;
  } finally {
    first.child.kill("SIGKILL");
  }
  assert.equal(exit.signal, null, `killed by ${exit.signal}: SIGTERM was not handled`);
  assert.equal(exit.code, 0, first.stderr());
  assert.ok(exit.at - signalledAt < jobMs + 2000, `exit took ${exit.at - signalledAt} ms after SIGTERM`);
  const done1 = first.lines();
  assert.equal(done1.length, firstLines + 1, "the job in hand at SIGTERM was finished");
  assert.ok(done1.length < M, "the first worker stopped consuming");

  const second = startExample(topic, `${dir}/second.out`);
  try {
    await until("every job processed", 30_000, () => new Set([...done1, ...second.lines()].map((l) => l.id)).size === M);
    await until("nothing left unacked", 5_000, async () => allSettled(await settledState(c, topic)));
  } finally {
    second.child.kill("SIGTERM");
  }
  const exit2 = await second.exited;
  assert.equal(exit2.code, 0, second.stderr());
  const done2 = second.lines();
  const ids1 = new Set(done1.map((l) => l.id));
  // The first worker acked what it finished (the job in hand included): none came back.
  assert.deepEqual(done2.filter((l) => ids1.has(l.id)), [], "a job the first worker finished was delivered again");
  assert.deepEqual([...new Set([...done1, ...done2].map((l) => l.id))].sort((a, b) => a - b), Array.from({ length: M }, (_, i) => i));
  assert.ok(allSettled(await settledState(c, topic)), JSON.stringify(await settledState(c, topic)));
});
