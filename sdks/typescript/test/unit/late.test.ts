/**
 * A late report (F2): the run was taken over while this segment's send was
 * in flight; the server keeps the report as evidence and answers `late:
 * true`. The SDK surfaces it as `LateReport` (a kind of `Fenced`, as the
 * Rust SDK's `is_fenced`) and the segment sends nothing more.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Charter, Fenced, LateReport, Segment } from "../../src/index.js";
import { FakeServer } from "./fake.js";
import { Bank } from "./target.js";

test("F2_X1_a_report_answered_late_is_LateReport_and_the_segment_sends_nothing_more", async () => {
  const server = new FakeServer();
  const charter = new Charter({ baseUrl: server.url, credential: "agent:secret", fetch: server.fetch });
  const bank = new Bank();
  const segment = await Segment.start(charter, "mis_1", "s-1");
  const ctx = await segment.startNode("pay");
  bank.onSend = () => server.takeOver(segment.runId); // another process recovers the run mid-send
  const late = await ctx.attempt(bank, "transfer", { to: "acme", cents: 400 }, { key: "t-1" }).catch((e: unknown) => e);
  assert.ok(LateReport.isInstance(late), String(late));
  assert.ok(Fenced.isInstance(late), "a late report is a kind of fenced");
  assert.equal(late.code, "late_report");
  const [attempt] = [...server.attempts.values()];
  assert.deepEqual(late.details, { run_id: segment.runId, attempt_id: attempt?.id, status: "unknown", settled: false });
  assert.equal(attempt?.late.length, 1, "kept as late evidence");
  assert.equal(attempt?.settlements, 0, "never settled by a fenced segment");
  assert.ok(segment.fenced);
  const before = server.seen.length;
  bank.onSend = () => undefined;
  await assert.rejects(ctx.attempt(bank, "transfer", { to: "acme", cents: 1 }, { key: "t-2" }), LateReport);
  await assert.rejects(segment.renew(), LateReport);
  assert.equal(server.seen.length, before, "nothing more was asked of the server");
  assert.equal(bank.received.length, 1, "nothing more was sent");
});
