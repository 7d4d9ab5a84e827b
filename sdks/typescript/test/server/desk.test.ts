/**
 * The desk's decisions from TypeScript, typed (N5, L5, L7, S1), against a real
 * server: a run stopped, a limit raised, incidents read, the audit chains
 * verified. A principal without the right is refused with its typed error and
 * nothing changes; what the server recorded is read back each time.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Charter, NotAuthorized, NotFound } from "../../src/index.js";
import { startWorld, type World } from "./harness.js";

let world: World;
const as = (name: string): Charter => new Charter({ baseUrl: world.url, credential: world.credential(name) });

before(async () => {
  world = await startWorld();
});
after(async () => {
  await world?.stop();
});

describe("the desk", () => {
  test("N5_a_run_stopped_with_a_payment_in_doubt_is_stopping_and_a_stranger_changes_nothing", async () => {
    const lost = await world.lost();
    const refused = await as("visitor").stop(lost.run, "not mine").then(
      () => assert.fail("a principal without stop stopped a run"),
      (error: unknown) => error,
    );
    assert.ok(refused instanceof NotAuthorized, String(refused));
    const ops = as("ops");
    assert.equal((await ops.coordinator.state(lost.run)).status, "needs_intervention");

    const stopped = await ops.stop(lost.run, "the wrong week");
    assert.equal(stopped.id, lost.run);
    assert.equal(stopped.status, "stopping", "it ends once the payment in doubt is settled");
    assert.equal((await ops.coordinator.state(lost.run)).status, "stopping");
    assert.equal((await world.payments(lost.invoice)).length, 1, "nothing sent by stopping");
  });

  test("L7_a_raised_limit_is_a_new_contract_version_and_its_balance", async () => {
    const ops = as("ops");
    const ledger = await ops.ledger(world.mission);
    assert.deepEqual(ledger.problems, []);
    const usd = ledger.balances.find((b) => b.unit === "usd_cents");
    assert.ok(usd !== undefined);
    const limit = usd.limit + 50_00;
    const raised = await ops.raiseLimit(world.mission, "usd_cents", limit);
    assert.equal(raised.mission_id, world.mission);
    assert.equal(raised.balance.limit, limit);
    assert.equal(raised.balance.available + raised.balance.held + raised.balance.spent, limit, "L0");
    const refused = await as("agent").raiseLimit(world.mission, "usd_cents", limit + 1).then(
      () => assert.fail("a principal without raise_limit raised a limit"),
      (error: unknown) => error,
    );
    assert.ok(refused instanceof NotAuthorized, String(refused));
    const after = (await ops.request("GET", `/missions/${world.mission}`)) as { contract_version: number };
    assert.equal(after.contract_version, raised.contract_version, "the refusal made no version");
    assert.equal((await ops.ledger(world.mission)).balances.find((b) => b.unit === "usd_cents")?.limit, limit);
  });

  test("L5_incidents_read_as_records_and_an_unknown_one_is_not_found", async () => {
    const ops = as("ops");
    const page = await ops.incidents(world.mission, { open: true });
    assert.ok(Array.isArray(page.items));
    for (const incident of page.items) assert.equal(incident.status, "open");
    const missing = await ops.closeIncident("inc_nonesuch", "nothing to close").then(
      () => assert.fail("an unknown incident was closed"),
      (error: unknown) => error,
    );
    assert.ok(missing instanceof NotFound, String(missing));
  });

  test("S1_the_audit_chains_verify", async () => {
    const verified = await as("ops").audit(world.mission);
    assert.equal(verified.ok, true);
    const [chain] = verified.chains;
    assert.equal(chain?.mission_id, world.mission);
    assert.ok((chain?.events ?? 0) > 0 && chain?.broken_at === null);
  });
});
