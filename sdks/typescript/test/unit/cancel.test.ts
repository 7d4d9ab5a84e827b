/**
 * Cancellation: an `AbortSignal` on every call, on `ctx.attempt` and in what
 * the adapter receives. A cancelled attempt rejects with the signal's reason
 * once what happened is on the record: not admitted (nothing written), not
 * sent (settled not applied), or cut off mid-send (UNKNOWN, for evidence).
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Charter, Segment } from "../../src/index.js";
import { FakeServer } from "./fake.js";
import { Bank } from "./target.js";

async function started(): Promise<{ server: FakeServer; charter: Charter; bank: Bank; segment: Segment }> {
  const server = new FakeServer();
  const charter = new Charter({ baseUrl: server.url, credential: "agent:secret", fetch: server.fetch, retry: { initialDelayMs: 1 } });
  const segment = await Segment.start(charter, "mis_1", "s-1");
  return { server, charter, bank: new Bank(), segment };
}

const reports = (server: FakeServer): Record<string, unknown>[] => [...server.attempts.values()].flatMap((a) => a.reports);

test("X1_A3_a_send_cancelled_mid_flight_is_reported_unknown_and_the_call_rejects_with_the_reason_at_once", async () => {
  const { server, bank, segment } = await started();
  const ctx = await segment.startNode("pay");
  const stop = new AbortController();
  bank.hold = true; // the transfer reached the bank and waits for its answer
  bank.onSend = () => setTimeout(() => stop.abort(new Error("the user closed the tab")), 20);
  const startedAt = performance.now();
  const cancelled = await ctx.attempt(bank, "transfer", { to: "acme", cents: 900 }, { key: "t-1", signal: stop.signal }).catch((e: unknown) => e);
  assert.ok(performance.now() - startedAt < 5_000, "cancelled, not waited out");
  assert.equal((cancelled as Error).message, "the user closed the tab", "rejected with the signal's reason");
  assert.equal(bank.received[0]?.signal.aborted, true, "the adapter was given the signal");
  assert.deepEqual(bank.cut, [bank.received[0]?.key]);
  const [attempt] = [...server.attempts.values()];
  assert.equal(attempt?.status, "unknown", "bytes may have left: UNKNOWN, never failed (A3)");
  assert.match(String(reports(server)[0]?.["reason"]), /^cancelled during the send/);
  // Asked again, the effect is blocked on its record: never sent blind.
  const again = await ctx.attempt(bank, "transfer", { to: "acme", cents: 900 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.equal((again as { code?: string }).code, "blocked");
  assert.equal(bank.received.length, 1);
});

test("X1_an_attempt_cancelled_before_it_is_admitted_writes_nothing", async () => {
  const { server, bank, segment } = await started();
  const ctx = await segment.startNode("pay");
  const stop = new AbortController();
  stop.abort(new Error("never mind"));
  await assert.rejects(ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1", signal: stop.signal }), /never mind/);
  assert.equal(server.count("POST", /\/attempts$/), 0);
  assert.equal(server.attempts.size, 0);
  assert.equal(bank.received.length, 0);
});

test("X1_A3_an_attempt_cancelled_while_it_was_admitted_is_never_sent_and_settles_not_applied", async () => {
  const { server, bank, segment } = await started();
  const ctx = await segment.startNode("pay");
  const stop = new AbortController();
  // The admission is made and answered; the caller cancels before the answer is read.
  server.arm("POST", /\/attempts$/, { kind: "then", run: () => stop.abort(new Error("too late")) });
  await assert.rejects(ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1", signal: stop.signal }), /too late/);
  assert.equal(bank.received.length, 0, "never sent");
  const [attempt] = [...server.attempts.values()];
  assert.equal(attempt?.status, "failed", "settled not applied, at no cost");
  assert.deepEqual(reports(server), [{ outcome: "not_applied", proof: { reason: "cancelled before sending" } }]);
});

test("X1_a_cancelled_read_rejects_with_the_reason_not_a_TransportError_and_a_wait_between_tries_is_cut_short", async () => {
  const { server, charter } = await started();
  server.arm("GET", /^\/me$/, { kind: "hang" });
  const stop = new AbortController();
  setTimeout(() => stop.abort(new Error("enough")), 20);
  await assert.rejects(charter.me({ signal: stop.signal }), /enough/);
  // A busy store's backoff is a wait the signal ends.
  const slow = new Charter({ baseUrl: server.url, credential: "agent:secret", fetch: server.fetch, retry: { initialDelayMs: 60_000, maxDelayMs: 60_000 } });
  server.arm("GET", /^\/me$/, { kind: "busy" });
  const later = new AbortController();
  setTimeout(() => later.abort(new Error("stop waiting")), 20);
  const startedAt = performance.now();
  await assert.rejects(slow.me({ signal: later.signal }), /stop waiting/);
  assert.ok(performance.now() - startedAt < 5_000);
});

test("X1_the_fetch_given_to_the_client_carries_every_call", async () => {
  const { server, charter, bank, segment } = await started();
  const ctx = await segment.startNode("pay");
  await ctx.attempt(bank, "transfer", { to: "acme", cents: 3 }, { key: "t-1" });
  await ctx.complete({ ok: true });
  await segment.finish();
  await charter.me();
  assert.deepEqual(
    server.seen.map((s) => `${s.method} ${s.path.replace(/(run|att)_\d+/g, "$1")}`),
    [
      "POST /missions/mis_1/runs", "POST /runs/run/nodes/pay/start", "POST /runs/run/attempts",
      "POST /attempts/att/report", "POST /runs/run/nodes/pay/complete", "POST /runs/run/finish", "GET /me",
    ],
  );
});
