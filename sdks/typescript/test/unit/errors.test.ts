/** The error answers of the API as typed errors: the code decides, the class follows it. */

import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  AdmissionRefused,
  AllowanceExceeded,
  CharterError,
  ERRORS,
  Fenced,
  LeaseHeld,
  StateError,
  StoreBusy,
  TransportError,
  UnexpectedError,
  fromAnswer,
} from "../../src/index.js";

/** The SDK's directory (the tests run compiled, from build/test/unit/). */
const SDK = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

test("each code the server answers becomes its class, kinds under their code", () => {
  const held = fromAnswer(409, { error: { code: "lease_held", message: "wait", run_id: "run_1" } });
  assert.ok(held instanceof LeaseHeld && held instanceof StateError && held instanceof CharterError);
  assert.equal(held.message, "wait");
  assert.deepEqual(held.details, { run_id: "run_1" });
  assert.equal(held.status, 409);
  const short = fromAnswer(409, { error: { code: "allowance_exceeded", message: "short" } });
  assert.ok(short instanceof AllowanceExceeded && short instanceof AdmissionRefused);
  assert.ok(fromAnswer(409, { error: { code: "fenced", message: "lost" } }) instanceof Fenced);
});

test("a code this SDK does not know keeps its code; an answer without one is unexpected_error", () => {
  const later = fromAnswer(409, { error: { code: "some_new_kind", message: "new" } });
  assert.equal(later.constructor, CharterError);
  assert.equal(later.code, "some_new_kind");
  const html = fromAnswer(502, "<html>bad gateway</html>");
  assert.ok(html instanceof UnexpectedError);
  assert.equal(html.status, 502);
});

test("every class's code is unique", () => {
  for (const [code, cls] of ERRORS) assert.equal(cls.code, code);
});

/**
 * Two copies of the package in one program: its ES module and its CommonJS
 * build (dist/, built before the tests) have their own classes. An error made
 * by one is recognised by the other's `isInstance`, kinds included, where
 * `instanceof` cannot see it; and the segment of one copy reads an adapter's
 * `NotApplied` made by the other as the proof it is.
 */
test("X2_an_error_of_another_copy_of_the_package_is_recognised_by_isInstance_with_its_kinds", async () => {
  const esm = (await import(join(SDK, "dist", "esm", "index.js"))) as typeof import("../../src/index.js");
  const cjs = createRequire(import.meta.url)(join(SDK, "dist", "cjs", "index.js")) as typeof import("../../src/index.js");
  assert.notEqual(esm.LeaseHeld, cjs.LeaseHeld, "two copies, two classes");
  const held = cjs.fromAnswer(409, { error: { code: "lease_held", message: "wait" } });
  assert.equal(held instanceof esm.LeaseHeld, false);
  assert.ok(esm.LeaseHeld.isInstance(held));
  assert.ok(esm.StateError.isInstance(held), "a kind is its parent code too");
  assert.ok(esm.CharterError.isInstance(held));
  assert.equal(esm.Fenced.isInstance(held), false);
  assert.equal(esm.StateError.isInstance(new Error("plain")), false);
  assert.equal(esm.CharterError.isInstance({ code: "lease_held" }), false, "a look-alike without the marker is not one");
  const late = new cjs.LateReport("late");
  assert.ok(esm.Fenced.isInstance(late) && esm.LateReport.isInstance(late));
  const later = cjs.fromAnswer(409, { error: { code: "some_new_kind", message: "new" } });
  assert.ok(esm.CharterError.isInstance(later));
  assert.equal(esm.StateError.isInstance(later), false);
  assert.ok(esm.NotApplied.isInstance(new cjs.NotApplied("refused")));
  assert.equal(esm.NotApplied.isInstance(new cjs.OutcomeUnknown("no answer")), false);
  assert.ok(esm.OutcomeUnknown.isInstance(new cjs.OutcomeUnknown("no answer")));
});

test("X1_store_busy_is_retryable_by_its_class_and_a_cause_is_kept", () => {
  const busy = fromAnswer(503, { error: { code: "store_busy", message: "busy" } });
  assert.ok(busy instanceof StoreBusy);
  assert.equal(busy.retryable, true);
  assert.equal(fromAnswer(409, { error: { code: "lease_held", message: "x" } }).retryable, false);
  const root = new TypeError("fetch failed");
  const lost = new TransportError("no answer", { cause: root, retryable: true });
  assert.equal(lost.cause, root);
  assert.equal(lost.retryable, true);
  assert.deepEqual(new LeaseHeld("x").kinds, ["lease_held", "invalid_state", "charter_error"]);
});
