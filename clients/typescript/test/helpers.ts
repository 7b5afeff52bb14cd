// Shared by the tests: the server under test (NARAD_URL, NARAD_USER, NARAD_PASS), unique topic
// names, a recording/fault-injecting HTTP proxy, and the example worker as a subprocess.
import { createServer } from "node:http";
import { spawn } from "node:child_process";
import { openSync, closeSync, readFileSync } from "node:fs";
import { Client, type ClientOptions } from "@narad/client";

export const URL_ = requireEnv("NARAD_URL");
export const USER = requireEnv("NARAD_USER");
export const PASS = requireEnv("NARAD_PASS");

function requireEnv(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run tests/typescript-client.sh, or set NARAD_URL, NARAD_USER, NARAD_PASS`);
  return v;
}

export function client(options: Partial<ClientOptions> = {}): Client {
  return new Client({ baseUrl: URL_, user: USER, password: PASS, ...options });
}

let counter = 0;
export function uniqueTopic(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${process.pid}-${counter++}`;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function until<T>(what: string, timeoutMs: number, probe: () => T | undefined | false | Promise<T | undefined | false>): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(50);
  }
}

/** One request the proxy saw, with the status it answered (0: not answered yet). */
export interface Seen {
  method: string;
  url: string;
  status: number;
  injected: boolean;
  at: number;
}

/**
 * A real HTTP proxy in front of NARAD_URL. `inject(req)` may answer instead of the server
 * (return a status, headers and body); everything else is forwarded. Every request is recorded.
 */
export async function startProxy(inject?: (method: string, url: string) => { status: number; headers: Record<string, string>; body: string } | undefined) {
  const seen: Seen[] = [];
  const server = createServer(async (req: any, res: any) => {
    const chunks: Uint8Array[] = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const fake = inject?.(req.method, req.url);
    if (fake) {
      res.writeHead(fake.status, { "content-type": "application/json", ...fake.headers });
      res.end(fake.body);
      seen.push({ method: req.method, url: req.url, status: fake.status, injected: true, at: Date.now() });
      return;
    }
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers as Record<string, string>)) {
      if (!["host", "connection", "content-length", "transfer-encoding"].includes(k)) headers[k] = v;
    }
    const entry: Seen = { method: req.method, url: req.url, status: 0, injected: false, at: Date.now() };
    seen.push(entry); // status 0 until the server answers
    const gone = new AbortController(); // the client hung up: stop waiting for the server too
    res.on("close", () => gone.abort());
    try {
      const up = await fetch(URL_ + req.url, { method: req.method, headers, body: body.length ? body : undefined, signal: gone.signal });
      const buf = Buffer.from(await up.arrayBuffer());
      const out: Record<string, string> = {};
      up.headers.forEach((v: string, k: string) => {
        if (!["connection", "content-length", "transfer-encoding", "content-encoding", "keep-alive"].includes(k)) out[k] = v;
      });
      res.writeHead(up.status, out);
      res.end(buf);
      entry.status = up.status;
    } catch (e) {
      res.writeHead(502);
      res.end(String(e));
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    seen,
    close: () => new Promise<void>((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
  };
}

const EXAMPLE = new globalThis.URL("../examples/worker.mjs", import.meta.url).pathname;
export const EXAMPLE_PATH = EXAMPLE;

/** examples/worker.mjs on `topic`, its stdout (one JSON line per finished job) into `outFile`. */
export function startExample(topic: string, outFile: string, baseUrl: string = URL_) {
  const fd = openSync(outFile, "w");
  const errFd = openSync(`${outFile}.stderr`, "w");
  const child = spawn(process.execPath, [EXAMPLE, topic], {
    env: { ...process.env, NARAD_URL: baseUrl, NARAD_USER: USER, NARAD_PASS: PASS },
    stdio: ["ignore", fd, errFd],
  });
  closeSync(fd);
  closeSync(errFd);
  const exited = new Promise<{ code: number | null; signal: string | null; at: number }>((resolve) =>
    child.on("exit", (code: number | null, signal: string | null) => resolve({ code, signal, at: Date.now() })),
  );
  return {
    child,
    exited,
    lines: (): Array<{ id: number; offset: number; delivery_count: number }> =>
      readFileSync(outFile, "utf8").split("\n").filter(Boolean).map((l: string) => JSON.parse(l)),
    stderr: (): string => readFileSync(`${outFile}.stderr`, "utf8"),
  };
}

/** Nothing left in the topic: no backlog, no lease, no delay, the frontier at the end. */
export async function settledState(c: Client, topic: string) {
  const t = await c.getTopic(topic);
  return t.partitions.map((p) => ({ partition: p.partition, available: p.available, in_flight: p.in_flight, delayed: p.delayed, frontier: p.frontier, next_offset: p.next_offset }));
}

export function allSettled(state: Awaited<ReturnType<typeof settledState>>): boolean {
  return state.every((p) => p.available === 0 && p.in_flight === 0 && p.delayed === 0 && p.frontier === p.next_offset);
}
