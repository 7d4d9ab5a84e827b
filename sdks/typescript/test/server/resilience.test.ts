/**
 * What the unit layer shows against its fake, shown against a real server and
 * the payments sandbox: a busy store (503 store_busy) asked again, a report
 * whose answer was lost sent again and settled once, a send cancelled in
 * flight and one cancelled before it went out, and a report made after the
 * run was taken over surfaced as `LateReport`. The fetch the client is given
 * only watches (or loses an answer the server did give); the server's record,
 * the ledger and the sandbox's own records are the judges.
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";

import { Charter, Fenced, LateReport, Segment } from "../../src/index.js";
import type { CharterOptions } from "../../src/index.js";
import { Payments, type Bill } from "../../examples/payments.js";
import { startWorld, type World } from "./harness.js";

let world: World;
let payments: Payments;
const bill = (reference: string): Bill => ({ amount: 12_00, currency: "usd", payee: "acme", reference });
const uniq = (): string => randomUUID().slice(0, 8);

/** A client whose every exchange is listed (method, path, status), through `watch` if given. */
function client(
  name: string,
  options: Partial<CharterOptions> & { watch?: (path: string, answer: Promise<Response>) => Promise<Response> } = {},
): { charter: Charter; seen: string[] } {
  const seen: string[] = [];
  const fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const path = new URL(input instanceof Request ? input.url : String(input)).pathname.replace(/^\/api\/v1/, "");
    const answer = globalThis.fetch(input, init).then((response) => {
      seen.push(`${init?.method ?? "GET"} ${path} ${response.status}`);
      return response;
    });
    return options.watch === undefined ? answer : options.watch(path, answer);
  };
  return { charter: new Charter({ baseUrl: world.url, credential: world.credential(name), fetch, ...options }), seen };
}

async function spent(ops: Charter): Promise<number> {
  return (await ops.ledger(world.mission)).balances.find((b) => b.unit === "usd_cents")?.spent ?? 0;
}

before(async () => {
  world = await startWorld({ busyTimeoutSeconds: 0.2 });
  payments = new Payments(world.sandbox, { timeoutMs: 60_000 });
});
after(async () => {
  await world?.stop();
});

test("X1_store_busy_while_another_writer_holds_the_store_is_asked_again_and_the_payment_is_made_once", async () => {
  const { charter, seen } = client("agent", { retry: { maxRetries: 8, initialDelayMs: 200, maxDelayMs: 800 } });
  const segment = await Segment.start(charter, world.mission, `ts-${uniq()}`);
  const ctx = await segment.startNode("pay");
  const reference = `inv-${uniq()}`;
  const lock = await world.lockStore(1.0);
  const paid = await ctx.attempt(payments, "pay", bill(reference), { key: reference });
  await lock.released;
  const admissions = seen.filter((s) => s.startsWith(`POST /runs/${segment.runId}/attempts`));
  assert.ok(admissions.includes(`POST /runs/${segment.runId}/attempts 503`), `the store was busy: ${admissions.join(", ")}`);
  assert.equal(admissions.at(-1), `POST /runs/${segment.runId}/attempts 200`);
  const records = await world.payments(reference);
  assert.deepEqual(records.map((p) => p.id), [paid.id], "paid once");
  const { items } = await client("ops").charter.attempts({ run: segment.runId });
  assert.deepEqual(items.map((a) => a.status), ["succeeded"], "one attempt: the busy answers wrote nothing");
  await segment.release();
});

test("X1_A4_a_report_whose_answer_was_lost_is_sent_again_and_the_ledger_spends_once", async () => {
  const ops = client("ops").charter;
  let lost = 0;
  const { charter, seen } = client("agent", {
    retry: { initialDelayMs: 50 },
    // The server records the first report; its answer never reaches the client.
    watch: async (path, answer) => {
      const response = await answer;
      if (path.endsWith("/report") && lost === 0) {
        lost += 1;
        await response.text();
        throw new TypeError("fetch failed", { cause: new Error("other side closed") });
      }
      return response;
    },
  });
  const segment = await Segment.start(charter, world.mission, `ts-${uniq()}`);
  const ctx = await segment.startNode("pay");
  const reference = `inv-${uniq()}`;
  const before = await spent(ops);
  const paid = await ctx.attempt(payments, "pay", bill(reference), { key: reference });
  const reports = seen.filter((s) => s.includes("/report"));
  assert.equal(reports.length, 2, "reported, its answer lost, reported again");
  assert.ok(reports.every((s) => s.endsWith(" 200")), reports.join(", "));
  const { items } = await ops.attempts({ run: segment.runId });
  assert.equal(items.length, 1);
  assert.deepEqual([items[0]?.status, items[0]?.actual], ["succeeded", { usd_cents: 1200 }]);
  assert.equal((await ops.attempt(items[0]!.id)).evidence.length, 0, "the second report recorded nothing more");
  assert.equal((await spent(ops)) - before, 1200, "the ledger spent it once");
  assert.deepEqual((await world.payments(reference)).map((p) => p.id), [paid.id]);
  await segment.release();
});

test("X1_A3_a_payment_cancelled_in_flight_rejects_at_once_and_stays_unknown_for_reconciliation", async () => {
  const { charter } = client("agent");
  const ops = client("ops").charter;
  const segment = await Segment.start(charter, world.mission, `ts-${uniq()}`);
  const ctx = await segment.startNode("pay");
  const reference = `inv-${uniq()}`;
  await world.fault("slow", { seconds: 30, reference }); // applied, its answer held back
  const stop = new AbortController();
  const watching = (async () => {
    while ((await world.payments(reference)).length === 0) await new Promise((done) => setTimeout(done, 20));
    stop.abort(new Error("the operator cancelled the payment"));
  })();
  const startedAt = performance.now();
  const cancelled = await ctx.attempt(payments, "pay", bill(reference), { key: reference, signal: stop.signal }).catch((e: unknown) => e);
  await watching;
  assert.ok(performance.now() - startedAt < 15_000, "not held for the sandbox's 30 s");
  assert.equal((cancelled as Error).message, "the operator cancelled the payment");
  const { items } = await ops.attempts({ run: segment.runId });
  assert.equal(items[0]?.status, "unknown", "the sandbox may have applied it: UNKNOWN, hold kept (A3)");
  assert.match(String(items[0]?.reason), /cancelled while the payment was in flight/);
  assert.equal((await world.payments(reference)).length, 1, "the sandbox applied it once");
  // Recovered, looked up by key and confirmed: settled on evidence, never sent again.
  await ops.coordinator.recover(segment.runId, `ts-${uniq()}`, { force: true });
  assert.equal((await ops.coordinator.reconcile(items[0]!.id, payments)).verdict, "applied");
  assert.equal((await ops.coordinator.confirm(items[0]!.id)).status, "succeeded");
  assert.equal((await world.payments(reference)).length, 1);
});

test("X1_A3_a_payment_cancelled_after_its_admission_is_never_sent_and_settles_failed_at_no_cost", async () => {
  const stop = new AbortController();
  const { charter } = client("agent", {
    watch: async (path, answer) => {
      const response = await answer;
      if (path.endsWith("/attempts")) stop.abort(new Error("cancelled while admitted"));
      return response;
    },
  });
  const segment = await Segment.start(charter, world.mission, `ts-${uniq()}`);
  const ctx = await segment.startNode("pay");
  const reference = `inv-${uniq()}`;
  await assert.rejects(ctx.attempt(payments, "pay", bill(reference), { key: reference, signal: stop.signal }), /cancelled while admitted/);
  assert.equal((await world.payments(reference)).length, 0, "the sandbox never saw it");
  const { items } = await client("ops").charter.attempts({ run: segment.runId });
  assert.equal(items[0]?.status, "failed");
  assert.ok(Object.values(items[0]?.actual ?? {}).every((v) => v === 0), "at no cost");
  await segment.release();
});

test("F2_X1_a_payment_whose_run_was_taken_over_mid_send_is_a_LateReport_and_the_segment_sends_nothing_more", async () => {
  const { charter, seen } = client("agent");
  const ops = client("ops").charter;
  const segment = await Segment.start(charter, world.mission, `ts-${uniq()}`);
  const ctx = await segment.startNode("pay");
  const reference = `inv-${uniq()}`;
  await world.fault("slow", { seconds: 2, reference });
  const takeover = (async () => {
    while ((await world.payments(reference)).length === 0) await new Promise((done) => setTimeout(done, 20));
    await ops.coordinator.recover(segment.runId, `ts-${uniq()}`, { force: true }); // the payer looks dead
  })();
  const late = await ctx.attempt(payments, "pay", bill(reference), { key: reference }).catch((e: unknown) => e);
  await takeover;
  assert.ok(LateReport.isInstance(late), String(late));
  assert.ok(Fenced.isInstance(late));
  const attemptId = String(late.details["attempt_id"]);
  const record = await ops.attempt(attemptId);
  assert.equal(late.details["status"], record.status);
  assert.equal(record.status, "unknown", "a fenced segment's report settles nothing under confirm (F2)");
  assert.ok(record.evidence.length >= 1, "the late report kept as evidence");
  assert.ok(segment.fenced);
  const asked = seen.length;
  const next = `inv-${uniq()}`;
  await assert.rejects(ctx.attempt(payments, "pay", bill(next), { key: next }), LateReport);
  assert.equal(seen.length, asked, "nothing more asked of the server");
  assert.equal((await world.payments(next)).length, 0, "nothing more sent");
  assert.equal((await world.payments(reference)).length, 1);
});
