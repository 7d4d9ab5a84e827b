/**
 * The recovery API with the seed's names (R1-R9, X2), against a real server:
 * a run whose payment the sandbox applied and whose answer was lost is
 * recovered, reconciled, settled and resumed from this process, and the
 * sandbox's own records show each invoice paid once. Refusals arrive as typed
 * errors and change nothing.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  AttemptAlreadySettled,
  AuthenticationError,
  Charter,
  CharterError,
  LeaseHeld,
  NotAuthorized,
  NotFound,
  SegmentReused,
  StateError,
  TransportError,
  UsageError,
} from "../../src/index.js";
import { freePort, startWorld, type World } from "./harness.js";

let world: World;
const as = (name: string): Charter => new Charter({ baseUrl: world.url, credential: world.credential(name) });

before(async () => {
  world = await startWorld();
});
after(async () => {
  await world?.stop();
});

describe("coordinator.recover", () => {
  test("R5_recover_answers_the_state_and_the_unresolved_attempt_ids", async () => {
    const lost = await world.lost();
    const ops = as("ops");
    const { state, unresolved } = await ops.coordinator.recover(lost.run, "ts-1");
    assert.deepEqual(unresolved, [lost.attempt]);
    assert.equal(state.runId, lost.run);
    assert.equal(state.epoch, 2, "a takeover is a new epoch (R2)");
    assert.equal(state.ownerSegment, "ts-1");
    const [attempt] = state.attempts;
    assert.equal(attempt?.status, "unknown", "the lost payment stays UNKNOWN with its hold (R4)");
    assert.equal(attempt?.request && (attempt.request as { reference: string }).reference, lost.invoice);
    // What the server recorded: the same state read back, and nothing sent again.
    const read = await ops.coordinator.state(lost.run);
    assert.equal(read.epoch, 2);
    assert.deepEqual(read.unresolved, [lost.attempt]);
    assert.equal((await world.payments(lost.invoice)).length, 1, "applied once, by the lost send");
  });

  test("R1_a_segment_used_before_is_refused_as_segment_reused_and_nothing_changes", async () => {
    const lost = await world.lost();
    const ops = as("ops");
    await ops.coordinator.recover(lost.run, "ts-1");
    const refused = await ops.coordinator.recover(lost.run, "ts-1").then(
      () => assert.fail("a reused segment was accepted"),
      (error: unknown) => error,
    );
    assert.ok(refused instanceof SegmentReused, String(refused));
    assert.ok(refused instanceof StateError, "segment_reused is a kind of invalid_state");
    assert.equal(refused.code, "segment_reused");
    assert.equal(refused.status, 409);
    assert.equal((await ops.coordinator.state(lost.run)).epoch, 2, "no new epoch");
  });

  test("R1_a_live_lease_is_lease_held_and_force_takes_it_over_audited", async () => {
    const lost = await world.lost({ leaseSeconds: 60 });
    const ops = as("ops");
    await assert.rejects(ops.coordinator.recover(lost.run, "ts-1"), (error: unknown) => {
      assert.ok(error instanceof LeaseHeld, String(error));
      assert.equal(error.status, 409);
      return true;
    });
    assert.equal((await ops.coordinator.state(lost.run)).ownerSegment, "py-1", "still the owner's");
    // monitor may recover but not stop: forcing is a stop's decision.
    await assert.rejects(as("monitor").coordinator.recover(lost.run, "ts-2", { force: true }), NotAuthorized);
    const { state, unresolved } = await ops.coordinator.recover(lost.run, "ts-3", { force: true });
    assert.equal(state.ownerSegment, "ts-3");
    assert.deepEqual(unresolved, [lost.attempt]);
  });

  test("P3_recover_needs_the_recover_right_and_a_valid_credential", async () => {
    const lost = await world.lost();
    const visitor = as("visitor");
    await assert.rejects(visitor.coordinator.recover(lost.run, "ts-x"), (error: unknown) => {
      assert.ok(error instanceof NotAuthorized, String(error));
      assert.equal(error.code, "not_authorized");
      assert.equal(error.status, 403);
      return true;
    });
    const [name] = world.credential("ops").split(":");
    const forged = new Charter({ baseUrl: world.url, credential: `${name}:not-the-secret` });
    await assert.rejects(forged.coordinator.recover(lost.run, "ts-y"), AuthenticationError);
    const state = await as("ops").coordinator.state(lost.run);
    assert.equal(state.epoch, 1, "neither refusal took the run over");
    assert.equal(state.ownerSegment, "py-1");
    // monitor holds recover (and reconcile) and nothing else: enough to take over.
    const { unresolved } = await as("monitor").coordinator.recover(lost.run, "ts-m");
    assert.deepEqual(unresolved, [lost.attempt]);
  });
});

describe("reconcile, confirm, resolve, resume", () => {
  test("R7_the_servers_lookup_finds_the_payment_a_person_confirms_and_the_run_pays_each_invoice_once", async () => {
    const lost = await world.lost();
    const ops = as("ops");
    await ops.coordinator.recover(lost.run, "ts-1");
    const found = await ops.coordinator.reconcile(lost.attempt);
    assert.equal(found.verdict, "applied");
    assert.equal(found.status, "unknown", "under evidence_settles = confirm, a person confirms");
    const settled = await ops.coordinator.confirm(lost.attempt);
    assert.equal(settled.status, "succeeded");
    assert.deepEqual(settled.actual, { usd_cents: 1200 });
    const resumed = await ops.coordinator.resumeOnServer(lost.run);
    assert.equal(resumed.status, "completed", JSON.stringify(resumed));
    for (const invoice of lost.invoices) {
      const paid = await world.payments(invoice);
      assert.equal(paid.length, 1, `${invoice} paid ${paid.length} times`);
    }
    await assert.rejects(ops.coordinator.confirm(lost.attempt), AttemptAlreadySettled);
  });

  test("R8_N6_a_persons_resolution_settles_it_and_the_payment_is_never_sent_again", async () => {
    const lost = await world.lost();
    const ops = as("ops");
    await ops.coordinator.recover(lost.run, "ts-1");
    const [record] = await world.payments(lost.invoice);
    assert.ok(record, "the sandbox applied the lost payment");
    const settled = await ops.coordinator.resolve(lost.attempt, {
      outcome: "succeeded",
      evidence: `sandbox payment ${record.id}`,
      cost: { usd_cents: record.amount },
    });
    assert.equal(settled.status, "succeeded");
    assert.deepEqual(settled.actual, { usd_cents: 1200 });
    // Settled applied with no answer on record: the node is not given one to go
    // on with, and the payment is not performed again (N6): a person decides.
    const resumed = await ops.coordinator.resumeOnServer(lost.run);
    assert.equal(resumed.status, "needs_intervention", JSON.stringify(resumed));
    assert.equal((await world.payments(lost.invoice)).length, 1, "never paid twice");
    assert.equal((await world.payments(lost.invoices[1] ?? "")).length, 0, "nothing after it either");
  });

  test("A10_bad_input_is_a_typed_refusal_and_changes_nothing", async () => {
    const lost = await world.lost();
    const ops = as("ops");
    await ops.coordinator.recover(lost.run, "ts-1");
    const bad = ops.coordinator.resolve(lost.attempt, { outcome: "maybe" as "failed", evidence: "?" });
    await assert.rejects(bad, (error: unknown) => {
      assert.ok(error instanceof UsageError, String(error));
      assert.equal(error.status, 400);
      return true;
    });
    const overflow = ops.coordinator.resolve(lost.attempt, { outcome: "succeeded", evidence: "x", cost: { usd_cents: 1.5 } });
    await assert.rejects(overflow, UsageError);
    const attempt = await ops.attempt(lost.attempt);
    assert.equal(attempt.status, "unknown", "still unresolved");
    assert.deepEqual(attempt.evidence, []);
    await assert.rejects(ops.coordinator.state("run_nothing"), (error: unknown) => {
      assert.ok(error instanceof NotFound);
      assert.equal(error.status, 404);
      return true;
    });
  });
});

describe("the client", () => {
  test("a server that does not answer is a TransportError, never a guessed code", async () => {
    const nobody = new Charter({ baseUrl: `http://127.0.0.1:${await freePort()}`, credential: "ops:x", timeoutMs: 2_000 });
    await assert.rejects(nobody.coordinator.state("run_x"), (error: unknown) => {
      assert.ok(error instanceof TransportError);
      assert.ok(error instanceof CharterError);
      assert.equal(error.code, "transport_error");
      return true;
    });
  });

  test("a credential that is not NAME:SECRET is refused before any request", () => {
    assert.throws(() => new Charter({ baseUrl: world.url, credential: "ops" }), (error: unknown) => {
      assert.ok(error instanceof CharterError);
      assert.equal(error.code, "usage_error");
      return true;
    });
  });

  test("K1_submit_queues_a_run_of_a_plan_and_the_listing_and_waits_show_it", async () => {
    const agent = as("agent");
    const run = await agent.submit(world.mission, "ts_fixture:week", { invoices: [] });
    assert.equal(run.status, "queued");
    const { items } = await agent.runs({ mission: world.mission, status: "queued" });
    assert.deepEqual(items.map((r) => r.id), [run.id]);
    const waits = await agent.waits(run.id);
    assert.equal(waits.run_id, run.id);
    assert.deepEqual(waits.waits, []);
    await assert.rejects(agent.submit(world.mission, "ts_fixture:week", [] as unknown as Record<string, unknown>), UsageError);
    assert.equal((await agent.runs({ mission: world.mission, status: "queued" })).items.length, 1, "the refused one queued nothing");
  });

  test("me names the principal the credential proves", async () => {
    assert.deepEqual(await as("monitor").me(), { principal: "monitor" });
  });
});
