/**
 * The remote attempt protocol (X1) from TypeScript, against a real server and
 * the payments sandbox: this process claims runs as segments, its own adapter
 * sends each admitted payment, and the sandbox's records are the judge —
 * nothing paid twice, nothing sent by a fenced or late segment.
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import {
  AllowanceExceeded,
  ApprovalRequired,
  AttemptFailed,
  Blocked,
  Charter,
  Fenced,
  LeaseHeld,
  NeedsIntervention,
  NotApplied,
  Segment,
  StateError,
  UsageError,
} from "../../src/index.js";
import type { Dispatch, Outcome } from "../../src/index.js";
import { Payments, type Bill } from "../../examples/payments.js";
import { freePort, startWorld, type World } from "./harness.js";

let world: World;
let payments: Payments;
const as = (name: string): Charter => new Charter({ baseUrl: world.url, credential: world.credential(name) });
const bill = (reference: string, amount = 12_00): Bill => ({ amount, currency: "usd", payee: "acme", reference });
const uniq = (): string => randomUUID().slice(0, 8);

before(async () => {
  world = await startWorld();
  payments = new Payments(world.sandbox);
});
after(async () => {
  await world?.stop();
});

describe("ctx.attempt", () => {
  test("A2_A4_an_admitted_payment_is_sent_once_with_its_key_and_a_new_execution_replays_it", async () => {
    const agent = as("agent");
    const segment = await Segment.start(agent, world.mission, `ts-${uniq()}`, { week: "W49" });
    assert.equal(segment.epoch, 1);
    // The node's execution is the one its journal on the server answers.
    const ctx = await segment.startNode("pay");
    assert.equal(ctx.execution, 1);
    assert.throws(() => segment.node("pay", -1), UsageError);
    assert.throws(() => segment.node("pay", 1.5), UsageError);
    const reference = `inv-${uniq()}`;
    const paid = (await ctx.attempt(payments, "pay", bill(reference), { key: reference })) as { id: string };
    const [record] = await world.payments(reference);
    assert.equal(record?.id, paid.id);
    const { items } = await agent.attempts({ run: segment.runId });
    assert.equal(items.length, 1);
    assert.equal(items[0]?.status, "succeeded");
    assert.equal(record?.idempotency_key, items[0]?.idempotency_key, "sent with the attempt's own key (A5)");
    assert.deepEqual(items[0]?.actual, { usd_cents: 1200 });
    // The node runs again (a new execution): the payment is replayed from its record.
    const again = (await segment.node("pay", ctx.execution + 1).attempt(payments, "pay", bill(reference), { key: reference })) as { id: string };
    assert.equal(again.id, paid.id);
    assert.equal((await world.payments(reference)).length, 1);
    assert.equal((await agent.attempts({ run: segment.runId })).items.length, 1, "no new attempt");
    await segment.release();
  });

  test("A3_a_lost_answer_is_unknown_and_blocks_the_node_never_a_guess", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    await world.fault("drop_after_apply", { reference });
    const ctx = await segment.startNode("pay");
    await assert.rejects(ctx.attempt(payments, "pay", bill(reference), { key: reference }), Blocked);
    const state = await as("ops").coordinator.state(segment.runId);
    assert.equal(state.attempts[0]?.status, "unknown");
    assert.equal((await world.payments(reference)).length, 1, "the sandbox applied it");
    // The same node asks again: blocked on the record, nothing sent.
    await assert.rejects(segment.node("pay", 2).attempt(payments, "pay", bill(reference), { key: reference }), Blocked);
    assert.equal((await world.payments(reference)).length, 1);
  });

  test("W2_an_effect_waits_for_its_approval_then_the_same_attempt_is_sent_once", async () => {
    const segment = await Segment.start(as("agent"), world.approvalsMission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    const ctx = await segment.startNode("pay");
    const waiting = await ctx.attempt(payments, "pay", bill(reference), { key: reference }).then(
      () => assert.fail("sent without its approval"),
      (error: unknown) => error,
    );
    assert.ok(waiting instanceof ApprovalRequired, String(waiting));
    const { approval_id: approval, attempt_id: attempt } = waiting.details as { approval_id: string; attempt_id: string };
    assert.equal((await world.payments(reference)).length, 0, "nothing sent before the approval");
    assert.equal((await as("ops").approve(approval)).status, "approved");
    await ctx.attempt(payments, "pay", bill(reference), { key: reference });
    const { items } = await as("agent").attempts({ run: segment.runId });
    assert.deepEqual(items.map((a) => [a.id, a.status]), [[attempt, "succeeded"]], "the same attempt, sent once");
    assert.equal((await world.payments(reference)).length, 1);
    // A denied one is voided and never sent.
    const denied = `inv-${uniq()}`;
    const refused = await ctx.attempt(payments, "pay", bill(denied), { key: denied }).catch((e: unknown) => e);
    assert.ok(refused instanceof ApprovalRequired);
    await as("ops").deny((refused.details as { approval_id: string }).approval_id);
    await assert.rejects(ctx.attempt(payments, "pay", bill(denied), { key: denied }), AttemptFailed);
    assert.equal((await world.payments(denied)).length, 0);
    await segment.release();
  });

  test("L3_an_estimate_over_the_allowance_is_refused_and_nothing_is_sent", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    const huge = bill(reference, 2_000_000);
    await assert.rejects((await segment.startNode("pay")).attempt(payments, "pay", huge, { key: reference }), AllowanceExceeded);
    assert.equal((await world.payments(reference)).length, 0);
    await segment.release();
  });

  test("F3_a_send_whose_deadline_passed_is_not_sent_and_settles_not_applied", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    let sent = 0;
    const slow: Payments = Object.create(payments) as Payments;
    Object.assign(slow, {
      async dispatch(send: Dispatch<Bill>): Promise<Outcome> {
        await new Promise((done) => setTimeout(done, send.deadlineMs + 50)); // past the server's 3 s
        send.checkDeadline();
        sent += 1;
        return payments.dispatch(send);
      },
    });
    const failed = await (await segment.startNode("pay")).attempt(slow, "pay", bill(reference), { key: reference }).then(
      () => assert.fail("a late send went out"),
      (error: unknown) => error,
    );
    assert.ok(failed instanceof AttemptFailed, String(failed));
    assert.equal(sent, 0);
    assert.equal((await world.payments(reference)).length, 0, "the sandbox never saw it");
    const { items } = await as("agent").attempts({ run: segment.runId });
    assert.deepEqual(items.map((a) => a.status), ["failed"], "one attempt, settled not applied, never retried blindly");
    assert.ok(Object.values(items[0]?.actual ?? {}).every((v) => v === 0), "at no cost (A3)");
    await segment.release();
  });
});

describe("claims", () => {
  test("R1_a_live_segment_holds_the_run_lease_held_and_F1_a_forced_takeover_fences_it", async () => {
    const first = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const stale = await first.startNode("pay");
    await assert.rejects(Segment.claim(as("ops"), first.runId, `ts-${uniq()}`), LeaseHeld);
    const second = await Segment.claim(as("ops"), first.runId, `ts-${uniq()}`, { force: true });
    assert.equal(second.epoch, 2);
    const reference = `inv-${uniq()}`;
    await assert.rejects(stale.attempt(payments, "pay", bill(reference), { key: reference }), Fenced);
    assert.ok(first.fenced);
    await assert.rejects(first.renew(), Fenced, "a fenced segment sends nothing more");
    assert.equal((await world.payments(reference)).length, 0, "the stale segment sent nothing");
    await second.release();
  });

  test("X1_item18_after_a_crash_recover_reconcile_confirm_claim_the_same_execution_replays_each_invoice_paid_once_and_the_run_completes", async () => {
    const week = [`inv-${uniq()}`, `inv-${uniq()}`, `inv-${uniq()}`];
    const [monday, tuesday] = week as [string, string, string];
    const crashed = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    await world.fault("drop_after_apply", { reference: tuesday });
    const ctx = await crashed.startNode("pay-week");
    assert.equal(ctx.execution, 1);
    await ctx.attempt(payments, "pay", bill(monday), { key: monday });
    await assert.rejects(ctx.attempt(payments, "pay", bill(tuesday), { key: tuesday }), Blocked);
    // This process "dies" here: it never releases. Another takes over.
    const ops = as("ops");
    const segment = `ts-${uniq()}`;
    const { unresolved, epoch } = await ops.coordinator.recover(crashed.runId, segment, { force: true });
    assert.equal(epoch, 2);
    assert.equal(unresolved.length, 1);
    const [lost] = unresolved as [string];
    // Continuing past an uncertain payment is refused until it is settled (R6, the human policy).
    await assert.rejects(Segment.claim(ops, crashed.runId, segment), NeedsIntervention);
    const found = await ops.coordinator.reconcile(lost, payments);
    assert.equal(found.verdict, "applied", JSON.stringify(found));
    assert.equal(found.status, "unknown", "evidence, until a person confirms it");
    const verdicts = (await ops.attempt(lost)).evidence.map((e) => e.verdict);
    assert.deepEqual(verdicts.filter((v) => v === "applied"), ["applied"], "the lookup, recorded as evidence");
    assert.equal((await ops.coordinator.confirm(lost)).status, "succeeded");
    const continued = await Segment.claim(ops, crashed.runId, segment);
    assert.equal(continued.epoch, 2);
    // The node was left running: starting it again gives the same execution, not the epoch.
    const again = await continued.startNode("pay-week");
    assert.equal(again.execution, ctx.execution);
    const paid: unknown[] = [];
    for (const invoice of week) paid.push(await again.attempt(payments, "pay", bill(invoice), { key: invoice }));
    for (const invoice of week) assert.equal((await world.payments(invoice)).length, 1, `${invoice} paid once`);
    const { items } = await ops.attempts({ run: crashed.runId });
    assert.equal(items.length, 3, "Monday and Tuesday replayed: no new attempt for them");
    assert.ok(items.every((a) => a.status === "succeeded" && a.execution === 1), JSON.stringify(items));
    const completed = await again.complete(paid);
    assert.equal(completed.execution, 1);
    const run = await continued.finish();
    assert.equal(run.status, "completed");
    const state = await ops.coordinator.state(crashed.runId);
    assert.equal(state.status, "completed");
    assert.deepEqual(
      state.record.nodes.map((n) => [n.node_id, n.execution, n.status, n.result_hash]),
      [["pay-week", 1, "completed", completed.result_hash]],
    );
    await assert.rejects(crashed.renew(), Fenced);
  });

  test("R7_reconcile_with_the_clients_adapter_records_what_its_lookup_found_and_nothing_else", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    await world.fault("drop_after_apply", { reference });
    await assert.rejects((await segment.startNode("pay")).attempt(payments, "pay", bill(reference), { key: reference }), Blocked);
    const ops = as("ops");
    const { unresolved } = await ops.coordinator.recover(segment.runId, `ts-${uniq()}`, { force: true });
    const [lost] = unresolved as [string];
    const evidence = async (): Promise<string[]> => (await ops.attempt(lost)).evidence.map((e) => e.verdict);
    const before = await evidence();
    // Another adapter's lookup proves nothing about this attempt: refused before anything is recorded.
    const other = Object.assign(Object.create(payments) as Payments, { name: "bank" });
    await assert.rejects(ops.coordinator.reconcile(lost, other), StateError);
    assert.deepEqual(await evidence(), before);
    // A lookup that fails is recorded as indeterminate, never as a verdict.
    await world.fault("lookups_unavailable");
    const unsure = await ops.coordinator.reconcile(lost, payments);
    assert.equal(unsure.verdict, "indeterminate");
    assert.equal(unsure.status, "unknown");
    const broken = Object.assign(Object.create(payments) as Payments, {
      lookup: async (): Promise<never> => {
        throw new Error("lookup crashed");
      },
    });
    const crashed = await ops.coordinator.reconcile(lost, broken);
    assert.equal(crashed.verdict, "indeterminate");
    assert.deepEqual(crashed.detail, { lookup_error: "Error: lookup crashed" });
    const found = await ops.coordinator.reconcile(lost, payments);
    assert.equal(found.verdict, "applied");
    assert.deepEqual(await evidence(), [...before, "indeterminate", "indeterminate", "applied"]);
    assert.equal((await ops.coordinator.confirm(lost)).status, "succeeded");
    assert.equal((await world.payments(reference)).length, 1);
  });

  test("A3_a_dispatch_that_proves_nothing_was_sent_settles_failed_at_no_cost", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const reference = `inv-${uniq()}`;
    const closed = new Payments(`http://127.0.0.1:${await freePort()}`); // nothing listens: refused before a byte
    await assert.rejects((await segment.startNode("pay")).attempt(closed, "pay", bill(reference), { key: reference }), AttemptFailed);
    const { items } = await as("agent").attempts({ run: segment.runId });
    assert.ok(items.every((a) => a.status === "failed" && Object.values(a.actual ?? {}).every((v) => v === 0)));
    assert.ok(new NotApplied("x") instanceof Error);
    await segment.release();
  });
});

describe("nodes and the end of a run", () => {
  test("X1_N1_item18_a_node_started_and_completed_is_journaled_on_the_server_and_finish_ends_the_run_completed", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const ctx = await segment.startNode("pay-week");
    assert.equal(ctx.execution, 1);
    assert.equal((await segment.startNode("pay-week")).execution, 1, "a node left running continues its execution");
    const reference = `inv-${uniq()}`;
    const paid = await ctx.attempt(payments, "pay", bill(reference), { key: reference });
    const running = await as("ops").coordinator.state(segment.runId);
    assert.deepEqual(running.record.nodes.map((n) => [n.node_id, n.execution, n.status]), [["pay-week", 1, "running"]]);
    const completed = await ctx.complete({ paid: [paid] });
    assert.deepEqual(Object.keys(completed).sort(), ["execution", "node_id", "result_hash", "run_id"]);
    assert.equal(completed.node_id, "pay-week");
    assert.deepEqual(await segment.completeNode("pay-week", 1, { paid: [paid] }), completed, "the same completion answers the same");
    await assert.rejects(segment.completeNode("pay-week", 1, { paid: [] }), StateError, "another result is refused");
    const state = await as("ops").coordinator.state(segment.runId);
    assert.deepEqual(
      state.record.nodes.map((n) => [n.node_id, n.execution, n.status, n.result_hash]),
      [["pay-week", 1, "completed", completed.result_hash]],
    );
    const run = await segment.finish();
    assert.equal(run.id, segment.runId);
    assert.equal(run.status, "completed");
    assert.equal((await as("ops").coordinator.state(segment.runId)).status, "completed");
    assert.equal((await world.payments(reference)).length, 1);
  });

  test("X1_item18_finish_is_refused_while_an_attempt_is_unresolved_and_a_failed_end_keeps_its_reason", async () => {
    const segment = await Segment.start(as("agent"), world.mission, `ts-${uniq()}`);
    const ctx = await segment.startNode("pay");
    const reference = `inv-${uniq()}`;
    await world.fault("drop_after_apply", { reference });
    await assert.rejects(ctx.attempt(payments, "pay", bill(reference), { key: reference }), Blocked);
    const [lost] = (await as("ops").coordinator.state(segment.runId)).unresolved as [string];
    const refused = await segment.finish().catch((error: unknown) => error);
    assert.ok(refused instanceof StateError, String(refused));
    assert.equal(refused.code, "invalid_state");
    assert.equal(refused.details["unresolved"], 1, "the count of unresolved attempts");
    assert.equal((await as("ops").coordinator.state(segment.runId)).status, "active", "nothing changed");
    // An execution the node's journal is not running cannot be completed.
    await assert.rejects(segment.completeNode("pay", ctx.execution + 1, null), StateError);
    // Once settled, the run can end; ended failed, it keeps why.
    await as("ops").coordinator.reconcile(lost, payments);
    await as("ops").coordinator.confirm(lost);
    const run = await segment.finish("failed", "the payee closed its account");
    assert.deepEqual([run.status, run.status_reason], ["failed", "the payee closed its account"]);
    const state = await as("ops").coordinator.state(segment.runId);
    assert.deepEqual([state.status, state.record.status_reason], ["failed", "the payee closed its account"]);
  });
});
