/** The error answers of the API as typed errors: the code decides, the class follows it. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { CharterError, ERRORS, LeaseHeld, StateError, UnexpectedError, fromAnswer, AllowanceExceeded, AdmissionRefused, Fenced } from "../../src/index.js";

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
