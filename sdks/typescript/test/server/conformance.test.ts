/**
 * X2: the language-neutral conformance suite of the remote attempt protocol
 * (sdks/conformance/cases.json), driven through this SDK's client against a
 * real server: `tests/test_conformance_protocol.py serve DIR` serves a fresh
 * store with one mission per case under the suite's contract. Each case is a
 * test named as the suite names it; every step's status, error code and
 * answer are checked as docs/protocol.md ("Conformance suite") says.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";

import { Charter, fromAnswer } from "../../src/index.js";
import { PYTHON, REPO } from "./harness.js";

interface Step {
  as: string;
  method: "GET" | "POST";
  path: string;
  body?: unknown;
  expect: { status: number; error?: string; body?: unknown };
  save?: Record<string, string>;
}
interface Case {
  name: string;
  steps: Step[];
}
interface Suite {
  version: number;
  cases: Case[];
}
interface Served {
  url: string;
  credentials: Record<string, string>;
  missions: Record<string, string>;
}

const SUITE = JSON.parse(readFileSync(join(REPO, "sdks", "conformance", "cases.json"), "utf8")) as Suite;
const VAR = /\{(\w+)\}/g;

/** `value` with each `{name}` replaced by a saved variable; exactly `"{name}"` keeps its JSON type. */
export function fill(value: unknown, saved: Record<string, unknown>): unknown {
  if (typeof value === "string") {
    const whole = /^\{(\w+)\}$/.exec(value);
    if (whole?.[1] !== undefined && whole[1] in saved) return saved[whole[1]];
    return value.replace(VAR, (all, name: string) => (name in saved ? String(saved[name]) : all));
  }
  if (Array.isArray(value)) return value.map((v) => fill(v, saved));
  if (typeof value === "object" && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, saved)]));
  }
  return value;
}

/** Where `answer` does not hold `expected`: objects key by key, lists and scalars exactly, `"$any"` anything present. */
export function contains(answer: unknown, expected: unknown, where = "$"): string[] {
  if (expected === "$any") return [];
  if (typeof expected === "object" && expected !== null && !Array.isArray(expected)) {
    if (typeof answer !== "object" || answer === null || Array.isArray(answer)) {
      return [`${where}: expected an object, got ${JSON.stringify(answer)}`];
    }
    return Object.entries(expected).flatMap(([key, value]) =>
      key in answer ? contains((answer as Record<string, unknown>)[key], value, `${where}.${key}`) : [`${where}.${key}: missing`],
    );
  }
  try {
    assert.deepStrictEqual(answer, expected);
    return [];
  } catch {
    return [`${where}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(answer)}`];
  }
}

function dotted(answer: unknown, path: string): unknown {
  return path.split(".").reduce<unknown>((at, key) => (at as Record<string, unknown>)[key], answer);
}

/** One step through the SDK's client: the HTTP status and the answer as it came. */
async function send(client: Charter, step: Step, saved: Record<string, unknown>): Promise<{ status: number; said: unknown }> {
  const path = fill(step.path, saved) as string;
  const body = step.method === "POST" ? fill(step.body ?? {}, saved) : undefined;
  const { status, answer } = await client.exchange(step.method, path, body);
  const code = (answer as { error?: { code?: unknown } } | null | undefined)?.error?.code;
  if (status >= 400 && typeof code === "string") {
    // The SDK's typed error for it carries the same code (what a program matches on);
    // an answer without one (a crashed server's text) fails on its status, shown whole.
    assert.equal(fromAnswer(status, answer).code, code);
  }
  return { status, said: answer };
}

let served: Served;
let server: ChildProcess;
let home: string;

before(async () => {
  home = await mkdtemp(join(tmpdir(), "charter-ts-conformance-"));
  server = spawn(PYTHON, [join(REPO, "tests", "test_conformance_protocol.py"), "serve", home], {
    stdio: ["ignore", "pipe", "inherit"],
    cwd: REPO,
  });
  const lines = createInterface({ input: server.stdout! });
  for await (const line of lines) {
    served = JSON.parse(line) as Served;
    break;
  }
  if (served === undefined) throw new Error(`the conformance server ended (exit ${server.exitCode})`);
});

after(async () => {
  if (server !== undefined && server.exitCode === null) {
    const ended = new Promise((done) => server.once("exit", done));
    server.kill("SIGTERM");
    await ended;
  }
  await rm(home, { recursive: true, force: true });
});

test("the driver's matcher finds what differs and lets $any through", () => {
  assert.deepEqual(contains({ a: 1, b: [1, 2] }, { a: 1, b: [1, 2] }), []);
  assert.equal(contains({ a: 1 }, { a: 2 }).length, 1);
  assert.equal(contains({ a: 1 }, { b: "$any" }).length, 1, "$any needs the key present");
  assert.equal(contains({ b: [1, 2, 3] }, { b: [1, 2] }).length, 1, "lists compare exactly");
  assert.deepEqual(fill({ p: "{run}", q: "x-{n}" }, { run: 7, n: "a" }), { p: 7, q: "x-a" });
});

describe(`the conformance suite, version ${SUITE.version}`, () => {
  for (const suiteCase of SUITE.cases) {
    test(suiteCase.name, async () => {
      const mission = served.missions[suiteCase.name];
      assert.ok(mission, `the server made no mission for ${suiteCase.name}`);
      const saved: Record<string, unknown> = { mission, uniq: randomUUID().slice(0, 8) };
      for (const [n, step] of suiteCase.steps.entries()) {
        const credential = served.credentials[step.as];
        assert.ok(credential, `no credential for ${step.as}`);
        const client = new Charter({ baseUrl: served.url, credential });
        const { status, said } = await send(client, step, saved);
        const at = `${suiteCase.name} step ${n} (${step.method} ${step.path}): ${JSON.stringify(said)}`;
        assert.equal(status, step.expect.status, at);
        if (step.expect.error !== undefined) {
          assert.equal((said as { error: { code: string } }).error.code, step.expect.error, at);
        }
        assert.deepEqual(contains(said, fill(step.expect.body ?? {}, saved)), [], at);
        for (const [name, key] of Object.entries(step.save ?? {})) saved[name] = dotted(said, key);
      }
    });
  }
});
