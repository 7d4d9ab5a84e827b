/**
 * The package as a user gets it: `npm pack` (which builds on `prepack`), the
 * tarball installed into an empty project in a temporary directory, then an
 * ES module program and a CommonJS program from that project each start a
 * run and pay an invoice through the payments sandbox with `@charter/sdk`,
 * and `tsc --noEmit` checks a TypeScript consumer of each module kind
 * against the shipped declarations. Nothing here reads the SDK's sources.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { Charter } from "../../src/index.js";
import { SDK, startWorld, type World } from "../server/harness.js";

const run = promisify(execFile);
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";
let world: World;
let home: string;
let app: string;
let packed: { filename: string; files: { path: string }[] };

/** A program that pays `reference` through the sandbox; `load` is how it gets the SDK. */
function program(load: string): string {
  return `${load}
const { CHARTER_URL, CHARTER_CREDENTIAL, CHARTER_MISSION, SANDBOX_URL, REFERENCE } = process.env;
const payments = {
  name: "payments",
  operations: { pay: { effect: "idempotent_keyed", dedupeWindowSeconds: 86400 } },
  estimate: (_operation, bill) => ({ amounts: { usd_cents: bill.amount } }),
  async dispatch(send) {
    send.checkDeadline();
    const answer = await fetch(SANDBOX_URL + "/v1/payments", {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": send.idempotencyKey, "x-fencing-token": send.fencingToken },
      body: JSON.stringify(send.request),
      signal: send.signal,
    });
    const body = await answer.json();
    if (!answer.ok) throw new OutcomeUnknown("answered " + answer.status, { body });
    return { status: "succeeded", result: body, cost: { usd_cents: body.amount }, receipt: body };
  },
  async lookup() { return { verdict: "indeterminate" }; },
};
async function main() {
  const charter = new Charter({ baseUrl: CHARTER_URL, credential: CHARTER_CREDENTIAL });
  const segment = await Segment.start(charter, CHARTER_MISSION, "pack-" + REFERENCE);
  const ctx = await segment.startNode("pay");
  const bill = { amount: 1200, currency: "usd", payee: "acme", reference: REFERENCE };
  const paid = await ctx.attempt(payments, "pay", bill, { key: REFERENCE });
  await ctx.complete(paid);
  const ended = await segment.finish();
  console.log(JSON.stringify({ run: segment.runId, status: ended.status, payment: paid.id, charterError: typeof CharterError.isInstance }));
}
main().catch((error) => { console.error(error); process.exit(1); });
`;
}

/** What a TypeScript consumer writes: checked against the declarations the tarball ships. */
const CONSUMER = `
const charter = new Charter({ baseUrl: "http://127.0.0.1:8765", credential: "agent:secret", retry: { maxRetries: 3 } });
interface Bill { amount: number; reference: string }
interface Paid { id: string; amount: number }
const adapter: Adapter<Bill, Paid> = {
  name: "payments",
  operations: { pay: { effect: "idempotent_keyed", dedupeWindowSeconds: 60 } },
  estimate: (_operation, bill) => ({ amounts: { usd_cents: bill.amount } }),
  dispatch: async (send) => ({ status: "succeeded", result: { id: send.idempotencyKey, amount: send.request.amount } }),
  lookup: async () => ({ verdict: "indeterminate" }),
};
export async function pay(runId: string, signal: AbortSignal): Promise<Paid> {
  const segment: Segment = await charter.coordinator.resume(runId, "seg-2", { signal });
  const ctx = await segment.startNode("pay");
  const paid: Paid = await ctx.attempt(adapter, "pay", { amount: 1, reference: "r" }, { key: "r", signal });
  // @ts-expect-error -- the request is a Bill
  await ctx.attempt(adapter, "pay", { cents: 1 }, { key: "r" });
  const run: Run = await segment.finish();
  // @ts-expect-error -- a run's status is one the protocol names
  const odd: "sleeping" = run.status;
  void odd;
  return paid;
}
export function busy(error: unknown): boolean {
  return StoreBusy.isInstance(error) && error.retryable;
}
`;

before(async () => {
  home = await mkdtemp(join(tmpdir(), "charter-pack-"));
  const { stdout } = await run(NPM, ["pack", "--json", "--pack-destination", home], { cwd: SDK, maxBuffer: 16 << 20 });
  [packed] = JSON.parse(stdout.slice(stdout.indexOf("["))) as [typeof packed];
  app = join(home, "app");
  await mkdir(app);
  await writeFile(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  await run(NPM, ["install", "--offline", "--no-audit", "--no-fund", join(home, packed.filename)], { cwd: app });
  world = await startWorld();
});
after(async () => {
  await world?.stop();
  if (home !== undefined) await rm(home, { recursive: true, force: true });
});

test("X2_the_tarball_ships_both_builds_their_declarations_the_sources_their_maps_name_and_the_license", () => {
  const files = new Set(packed.files.map((f) => f.path));
  for (const needed of [
    "package.json", "README.md", "LICENSE",
    "dist/esm/index.js", "dist/esm/index.d.ts", "dist/esm/index.js.map", "dist/esm/segment.d.ts.map",
    "dist/cjs/index.js", "dist/cjs/index.d.ts", "dist/cjs/package.json", "src/index.ts", "src/segment.ts",
  ]) {
    assert.ok(files.has(needed), `${needed} is in the tarball`);
  }
  assert.ok([...files].every((f) => !f.startsWith("test/") && !f.startsWith("build/") && !f.startsWith("examples/")), "no tests");
});

test("X2_an_ES_module_program_and_a_CommonJS_program_installed_from_the_tarball_each_pay_through_the_sandbox", async () => {
  await writeFile(join(app, "pay.mjs"), program('import { Charter, CharterError, OutcomeUnknown, Segment } from "@charter/sdk";'));
  await writeFile(join(app, "pay.cjs"), program('const { Charter, CharterError, OutcomeUnknown, Segment } = require("@charter/sdk");'));
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  for (const file of ["pay.mjs", "pay.cjs"]) {
    const reference = `inv-${randomUUID().slice(0, 8)}`;
    const env = {
      ...process.env, CHARTER_URL: world.url, CHARTER_CREDENTIAL: world.credential("agent"),
      CHARTER_MISSION: world.mission, SANDBOX_URL: world.sandbox, REFERENCE: reference,
    };
    const { stdout } = await run(process.execPath, [file], { cwd: app, env });
    const said = JSON.parse(stdout) as { run: string; status: string; payment: string; charterError: string };
    assert.equal(said.status, "completed", file);
    assert.equal(said.charterError, "function");
    assert.deepEqual((await world.payments(reference)).map((p) => p.id), [said.payment], `${file} paid once`);
    assert.equal((await ops.coordinator.state(said.run)).status, "completed");
  }
});

test("X2_a_TypeScript_consumer_of_either_module_kind_type_checks_against_the_shipped_declarations", async () => {
  await writeFile(join(app, "consumer.ts"), `import { Charter, Segment, StoreBusy } from "@charter/sdk";\nimport type { Adapter, Run } from "@charter/sdk";\n${CONSUMER}`);
  await writeFile(join(app, "consumer.cts"), `import { Charter, Segment, StoreBusy } from "@charter/sdk";\nimport type { Adapter, Run } from "@charter/sdk";\n${CONSUMER}`);
  const config = {
    compilerOptions: {
      module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", strict: true, noEmit: true,
      skipLibCheck: false, typeRoots: [join(SDK, "node_modules", "@types")], types: ["node"],
    },
    files: ["consumer.ts", "consumer.cts"],
  };
  await writeFile(join(app, "tsconfig.json"), JSON.stringify(config));
  const tsc = join(SDK, "node_modules", "typescript", "bin", "tsc");
  const checked = await run(process.execPath, [tsc, "-p", join(app, "tsconfig.json")], { cwd: app }).catch((e: { stdout: string }) => e);
  assert.equal((checked as { stdout: string }).stdout, "", "tsc --noEmit finds nothing, and each @ts-expect-error an error");
  // And a mistake is one: the declarations are not `any`.
  await writeFile(join(app, "wrong.ts"), 'import { Charter } from "@charter/sdk";\nconst n: number = new Charter({ baseUrl: "x", credential: "a:b" }).baseUrl;\n');
  const alone = { ...config, files: ["wrong.ts"] };
  await writeFile(join(app, "tsconfig.wrong.json"), JSON.stringify(alone));
  const refused = await run(process.execPath, [tsc, "-p", join(app, "tsconfig.wrong.json")], { cwd: app }).then(
    () => "",
    (e: { stdout: string }) => e.stdout,
  );
  assert.match(refused, /TS2322/);
});
