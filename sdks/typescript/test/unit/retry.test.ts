/**
 * Retries where the protocol says they are safe, against the in-process
 * fake server: a busy store (503 store_busy wrote nothing) is asked again
 * for any call; a repeatable call (a read, a report) that got no answer is
 * asked again; a decision that got no answer never is. What the fake
 * received and settled is the judge.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Charter, Segment, SettlementUnrecorded, StoreBusy, TransportError, UnexpectedError } from "../../src/index.js";
import { FakeServer } from "./fake.js";
import { Bank } from "./target.js";

const FAST = { initialDelayMs: 1, maxDelayMs: 5 };

function world(retry: ConstructorParameters<typeof Charter>[0]["retry"] = FAST): { server: FakeServer; charter: Charter; bank: Bank } {
  const server = new FakeServer();
  const charter = new Charter({ baseUrl: server.url, credential: "agent:secret", fetch: server.fetch, retry });
  return { server, charter, bank: new Bank() };
}

test("X1_store_busy_on_an_admission_is_asked_again_and_the_effect_is_sent_once", async () => {
  const { server, charter, bank } = world();
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/attempts$/, { kind: "busy" }, 2);
  const receipt = await ctx.attempt(bank, "transfer", { to: "acme", cents: 500 }, { key: "t-1" });
  assert.deepEqual(receipt, { id: "tx-1", cents: 500 });
  assert.equal(server.count("POST", /\/attempts$/), 3, "two busy answers, then admitted");
  assert.equal(server.attempts.size, 1, "one attempt recorded");
  assert.equal(bank.received.length, 1, "sent once");
  assert.equal([...server.attempts.values()][0]?.settlements, 1);
});

test("X1_a_store_busy_past_the_policy_is_StoreBusy_retryable_and_nothing_was_admitted", async () => {
  const { server, charter, bank } = world({ ...FAST, maxRetries: 1 });
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/attempts$/, { kind: "busy" }, 5);
  const refused = await ctx.attempt(bank, "transfer", { to: "acme", cents: 500 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(StoreBusy.isInstance(refused), String(refused));
  assert.equal(refused.retryable, true);
  assert.equal(refused.status, 503);
  assert.equal(server.count("POST", /\/attempts$/), 2, "the first try and one retry");
  assert.equal(server.attempts.size, 0);
  assert.equal(bank.received.length, 0);
  // retry: false asks once.
  const once = world(false);
  once.server.arm("GET", /^\/me$/, { kind: "busy" });
  await assert.rejects(once.charter.me(), StoreBusy);
  assert.equal(once.server.count("GET", /^\/me$/), 1);
});

test("X1_A4_a_report_whose_answer_was_lost_is_sent_again_and_settles_once", async () => {
  const { server, charter, bank } = world();
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/report$/, { kind: "drop" });
  const receipt = await ctx.attempt(bank, "transfer", { to: "acme", cents: 700 }, { key: "t-1" });
  assert.equal(receipt.cents, 700);
  const [attempt] = [...server.attempts.values()];
  assert.equal(attempt?.reports.length, 2, "the report, sent again after its answer was lost");
  assert.equal(attempt?.settlements, 1, "settled once");
  assert.equal(attempt?.status, "succeeded");
  assert.equal(bank.received.length, 1, "the effect itself was never sent again");
});

test("X1_a_report_that_never_gets_an_answer_is_SettlementUnrecorded_with_its_cause_and_the_attempt_stays_dispatched", async () => {
  const { server, charter, bank } = world({ ...FAST, maxRetries: 2 });
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/report$/, { kind: "refuse" }, 10);
  const lost = await ctx.attempt(bank, "transfer", { to: "acme", cents: 700 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(SettlementUnrecorded.isInstance(lost), String(lost));
  assert.ok(TransportError.isInstance(lost.cause), "the network's error kept as cause");
  assert.equal(server.count("POST", /\/report$/), 3);
  assert.equal([...server.attempts.values()][0]?.status, "dispatched", "nothing settled on a guess");
  assert.equal(bank.received.length, 1);
});

test("X1_an_admission_that_got_no_answer_is_never_asked_again", async () => {
  const { server, charter, bank } = world();
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/attempts$/, { kind: "drop" });
  const lost = await ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(TransportError.isInstance(lost), String(lost));
  assert.equal(lost.retryable, false, "whether the server admitted it is unknown");
  assert.ok(lost.cause instanceof TypeError);
  assert.equal(server.count("POST", /\/attempts$/), 1);
  assert.equal(bank.received.length, 0, "nothing sent");
  // Asked again by the caller, the same effect is blocked on its record, never sent blind.
  const blocked = await ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.equal((blocked as { code?: string }).code, "blocked");
  assert.equal(bank.received.length, 0);
});

test("X1_a_read_without_an_answer_or_behind_a_gateways_502_is_asked_again_a_decision_behind_one_is_not", async () => {
  const { server, charter } = world();
  server.arm("GET", /^\/me$/, { kind: "refuse" });
  server.arm("GET", /^\/me$/, { kind: "answer", status: 502, body: "<html>bad gateway</html>" });
  assert.deepEqual(await charter.me(), { principal: "agent" });
  assert.equal(server.count("GET", /^\/me$/), 3);
  server.arm("POST", /\/missions\/.*\/runs$/, { kind: "answer", status: 502, body: "<html>bad gateway</html>" });
  const refused = await Segment.start(charter, "mis_1", "s-1").catch((e: unknown) => e);
  assert.ok(UnexpectedError.isInstance(refused));
  assert.equal(refused.retryable, false);
  assert.equal(server.count("POST", /\/missions\/.*\/runs$/), 1);
});

test("a retry policy that is not one is refused when the client is made", () => {
  assert.throws(() => new Charter({ baseUrl: "http://x", credential: "a:b", retry: { maxRetries: -1 } }), RangeError);
  assert.throws(() => new Charter({ baseUrl: "http://x", credential: "a:b", retry: { maxRetries: 1.5 } }), RangeError);
});
