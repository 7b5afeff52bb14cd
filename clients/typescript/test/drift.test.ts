// 5. Drift: the committed src/openapi.ts must be what scripts/gen-types.mjs makes of the live
// server's /openapi.json, and every /v1 operation of that document must be implemented.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { IMPLEMENTED_OPERATIONS, OPERATIONS } from "@narad/client";
import { URL_ } from "./helpers.js";

// Operations under /v1 the client deliberately does not call. Empty today. (Everything outside
// /v1 is out of scope anyway: /health, /openapi.json, /metrics, the /console pages.)
const EXCLUDED: string[] = [];

const gen = await import(new URL("../scripts/gen-types.mjs", import.meta.url).href);
const live = await (await fetch(`${URL_}/openapi.json`)).json();

test("src/openapi.ts is what gen-types makes of the live /openapi.json", () => {
  const committed = readFileSync(new URL("../src/openapi.ts", import.meta.url), "utf8");
  const fresh: string = gen.generate(live);
  if (fresh !== committed) {
    const a = committed.split("\n");
    const b = fresh.split("\n");
    let i = 0;
    while (i < a.length && a[i] === b[i]) i++;
    assert.fail(
      `src/openapi.ts differs from the server's /openapi.json from line ${i + 1}:\n` +
        `  committed: ${a[i] ?? "(end)"}\n  live:      ${b[i] ?? "(end)"}\n` +
        "regenerate it (npm run gen-types), rebuild, and fix what no longer compiles",
    );
  }
});

test("every /v1 operation of the live document is implemented by the client", () => {
  const missing: string[] = [];
  for (const [path, item] of Object.entries(live.paths as Record<string, Record<string, { operationId?: string }>>)) {
    if (!path.startsWith("/v1/") && path !== "/v1") continue;
    for (const [method, op] of Object.entries(item)) {
      if (!["get", "put", "post", "patch", "delete"].includes(method)) continue;
      const id = op.operationId ?? `${method} ${path}`;
      if (!(id in IMPLEMENTED_OPERATIONS) && !EXCLUDED.includes(id)) missing.push(`${id} (${method.toUpperCase()} ${path})`);
    }
  }
  assert.deepEqual(missing, [], `not implemented by @narad/client: ${missing.join(", ")}`);
  // And nothing the client calls has gone from the document.
  const gone = Object.keys(IMPLEMENTED_OPERATIONS).filter((id) => !(id in OPERATIONS));
  assert.deepEqual(gone, []);
});
