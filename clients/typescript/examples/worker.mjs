import { Client, Worker } from "@narad/client";
const client = new Client({ baseUrl: process.env.NARAD_URL, user: process.env.NARAD_USER, password: process.env.NARAD_PASS });
const worker = new Worker(client, process.argv[2] ?? "jobs", async (msg) => {
  const job = msg.payload; // e.g. {"id": 7, "sleep_ms": 500, "fail_first": false}
  await new Promise((resolve) => setTimeout(resolve, job.sleep_ms ?? 0));
  if (job.fail_first && msg.delivery_count === 1) throw new Error(`job ${job.id} failed; it comes back`);
  console.log(JSON.stringify({ id: job.id, offset: msg.offset, delivery_count: msg.delivery_count }));
}); // resolves: ack; throws: nack; the lease is extended every third of the visibility timeout meanwhile
await worker.stopOnSignals().run(); // SIGTERM/SIGINT: stop consuming, finish and ack the job in hand, exit
