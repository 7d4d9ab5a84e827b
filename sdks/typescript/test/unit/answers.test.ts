/**
 * Answers are checked, not cast: a server (or a proxy in front of it) that
 * answers something the protocol does not say is a `ProtocolError` naming
 * where, before anything is done with it; fields the server adds are kept.
 * And `ctx.attempt` answers the adapter's result type.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Charter, Context, ProtocolError, Segment } from "../../src/index.js";
import type { Adapter } from "../../src/index.js";
import { FakeServer } from "./fake.js";
import { Bank, type Receipt } from "./target.js";

function client(server: FakeServer): Charter {
  return new Charter({ baseUrl: server.url, credential: "agent:secret", fetch: server.fetch, retry: false });
}

test("X1_a_claim_without_its_token_is_a_ProtocolError_naming_the_field", async () => {
  const server = new FakeServer();
  const claim = { run_id: "run_1", mission_id: "mis_1", segment: "s-1", epoch: 1, lease_ms: 30_000, status: "active" };
  server.arm("POST", /\/runs$/, { kind: "answer", status: 200, body: claim });
  const wrong = await Segment.start(client(server), "mis_1", "s-1").catch((e: unknown) => e);
  assert.ok(ProtocolError.isInstance(wrong), String(wrong));
  assert.equal(wrong.details["at"], "answer.claim");
  server.arm("POST", /\/runs$/, { kind: "answer", status: 200, body: { ...claim, claim: "clm_1", epoch: "1" } });
  const epoch = await Segment.start(client(server), "mis_1", "s-1").catch((e: unknown) => e);
  assert.equal((epoch as ProtocolError).details["at"], "answer.epoch");
  // A field the server adds later is no error.
  server.arm("POST", /\/runs$/, { kind: "answer", status: 200, body: { ...claim, claim: "clm_1", region: "eu" } });
  assert.equal((await Segment.start(client(server), "mis_1", "s-1")).epoch, 1);
});

test("X1_A3_an_admission_answered_with_an_unknown_action_or_a_send_without_its_key_sends_nothing", async () => {
  const server = new FakeServer();
  const bank = new Bank();
  const segment = await Segment.start(client(server), "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  server.arm("POST", /\/attempts$/, { kind: "answer", status: 200, body: { action: "guess", attempt_id: "att_9", status: "dispatched" } });
  const odd = await ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(ProtocolError.isInstance(odd), String(odd));
  assert.equal(odd.details["at"], "answer.action");
  assert.equal(bank.received.length, 0);
  server.arm("POST", /\/attempts$/, { kind: "answer", status: 200, body: { action: "send", attempt_id: "att_9", status: "dispatched", fencing_token: "run_1:1", send_deadline_ms: 1000 } });
  const keyless = await ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(ProtocolError.isInstance(keyless), String(keyless));
  assert.equal(keyless.details["at"], "answer.idempotency_key");
  assert.equal(bank.received.length, 0, "never sent without its key (A5)");
  const report = server.seen.filter((s) => s.path === "/attempts/att_9/report").map((s) => s.body["outcome"]);
  assert.deepEqual(report, ["not_applied"], "reported as never sent, so it does not stay dispatched");
});

test("X1_a_page_of_runs_with_a_status_the_protocol_does_not_have_is_refused", async () => {
  const server = new FakeServer();
  server.arm("GET", /^\/runs$/, { kind: "answer", status: 200, body: { items: [{ id: "run_1", status: "sleeping" }], next: null } });
  const wrong = await client(server).runs().catch((e: unknown) => e);
  assert.ok(ProtocolError.isInstance(wrong));
  assert.equal(wrong.details["at"], "answer.items[0].mission_id");
});

test("X1_ctx_attempt_answers_the_adapters_result_type_and_a_replay_the_same_record", async () => {
  const server = new FakeServer();
  const bank = new Bank();
  const segment = await Segment.start(client(server), "mis_1", "s-1");
  const ctx: Context = await segment.startNode("pay");
  const receipt: Receipt = await ctx.attempt(bank, "transfer", { to: "acme", cents: 250 }, { key: "t-1" });
  const replayed: Receipt = await ctx.attempt(bank, "transfer", { to: "acme", cents: 250 }, { key: "t-1" });
  assert.deepEqual(replayed, receipt);
  assert.equal(bank.received.length, 1, "replayed from its record");
  // The compiler holds the types: a wrong request, or reading the result as another type, does not compile.
  const typed = async (): Promise<void> => {
    // @ts-expect-error -- a Transfer has `cents`, not `amount`
    await ctx.attempt(bank, "transfer", { to: "acme", amount: 1 }, { key: "x" });
    // @ts-expect-error -- the bank answers a Receipt, not a string
    const text: string = await ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "x" });
    const loose: Adapter = bank; // any adapter, its result unknown
    const unknownResult = await ctx.attempt(loose, "transfer", {}, { key: "x" });
    // @ts-expect-error -- unknown until checked
    unknownResult.id;
    void text;
  };
  void typed;
});

test("X1_R9_coordinator_resume_continues_the_run_here_as_a_segment_as_the_rust_sdks_does", async () => {
  const server = new FakeServer();
  const charter = client(server);
  const first = await Segment.start(charter, "mis_1", "s-1");
  const taken = await charter.coordinator.resume(first.runId, "s-2");
  assert.ok(taken instanceof Segment);
  assert.deepEqual([taken.name, taken.epoch], ["s-2", 2], "a new segment takes the run over");
  assert.deepEqual(server.seen.at(-1), { method: "POST", path: `/runs/${first.runId}/claim`, body: { segment: "s-2", force: false } });
  await assert.rejects(first.renew(), /no longer holds/);
});
