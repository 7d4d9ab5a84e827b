/**
 * A real Charter server for the tests, started by them: the payments sandbox
 * (`charter sandbox`), a store prepared through Charter's Python API
 * (`ts_fixture.py`), and `charter serve` over it on a free loopback port.
 * Nothing here stands in for the server: every call the SDK makes in a test
 * reaches the engine, and what the sandbox applied is read from its records.
 */

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
/** The SDK's directory (tests run compiled, from build/test/server/). */
export const SDK = resolve(here, "..", "..", "..");
export const FIXTURES = join(SDK, "test", "server");
export const REPO = resolve(SDK, "..", "..");
const VENV = process.env["CHARTER_VENV"] ?? join(REPO, ".venv");
export const PYTHON = join(VENV, "bin", "python");
export const CHARTER = join(VENV, "bin", "charter");

export interface Lost {
  run: string;
  attempt: string;
  invoice: string;
  invoices: string[];
  lease_expires_us: number;
}

export interface Payment {
  id: string;
  amount: number;
  reference: string;
  idempotency_key: string;
  [field: string]: unknown;
}

interface Fixture {
  mission: string;
  approvals_mission: string;
  credentials: Record<string, string>;
}

export class World {
  readonly home: string;
  readonly url: string;
  readonly sandbox: string;
  readonly mission: string;
  /** A mission whose payments each need an approval (W2). */
  readonly approvalsMission: string;
  readonly credentials: Record<string, string>;
  readonly #children: ChildProcess[];

  constructor(home: string, url: string, sandbox: string, fixture: Fixture, children: ChildProcess[]) {
    this.home = home;
    this.url = url;
    this.sandbox = sandbox;
    this.mission = fixture.mission;
    this.approvalsMission = fixture.approvals_mission;
    this.credentials = fixture.credentials;
    this.#children = children;
  }

  credential(name: string): string {
    const found = this.credentials[name];
    if (found === undefined) throw new Error(`the fixture has no principal ${name}`);
    return found;
  }

  /**
   * A run whose first payment the sandbox applied and whose answer was lost
   * (UNKNOWN), its process gone. By default its owner's three-second lease has
   * run out when this returns (long enough for the fixture's own run to reach
   * its block on a loaded machine, where CI runs it at a low priority beside
   * the Python suite); `{ leaseSeconds }` leaves a longer one held.
   */
  async lost(options: { leaseSeconds?: number } = {}): Promise<Lost> {
    const lease = options.leaseSeconds ?? 3;
    const args = [join(FIXTURES, "ts_fixture.py"), "lost", this.home, String(lease)];
    const { stdout } = await run(PYTHON, args, { env: this.env() });
    const found = JSON.parse(stdout) as Lost;
    if (options.leaseSeconds === undefined) {
      const left = found.lease_expires_us / 1000 - Date.now() + 100;
      if (left > 0) await new Promise((done) => setTimeout(done, left));
    }
    return found;
  }

  /**
   * A new mission for an agent's tools (`tools.*`) and model calls
   * (`model.*`), run by `agent` and decided by `ops`, under an allowance in
   * cents and tokens; `overrides` replaces the contract's top-level keys
   * (`allowance`, `approvals`).
   */
  async agentsMission(overrides: Record<string, unknown> = {}): Promise<string> {
    const args = [join(FIXTURES, "ts_fixture.py"), "mission", this.home, JSON.stringify(overrides)];
    const { stdout } = await run(PYTHON, args, { env: this.env() });
    return (JSON.parse(stdout) as { mission: string }).mission;
  }

  /** What the sandbox applied for a client reference: its own records. */
  async payments(reference: string): Promise<Payment[]> {
    const answer = await fetch(`${this.sandbox}/v1/payments?reference=${encodeURIComponent(reference)}`);
    return ((await answer.json()) as { data: Payment[] }).data;
  }

  /** Arm one of the sandbox's misbehaviours for its next request(s). */
  async fault(fault: string, options: { times?: number; seconds?: number; reference?: string } = {}): Promise<void> {
    const answer = await fetch(`${this.sandbox}/_sandbox/faults`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ fault, times: options.times ?? 1, seconds: options.seconds ?? 0, reference: options.reference }),
    });
    if (!answer.ok) throw new Error(`the sandbox refused fault ${fault}: ${await answer.text()}`);
  }

  /**
   * Hold the store's write lock for `seconds` from another process (SQLite's
   * `BEGIN EXCLUSIVE`), as a long writer would: resolves once it is held,
   * and `released` once it is let go.
   */
  async lockStore(seconds: number): Promise<{ released: Promise<void> }> {
    const script =
      "import sqlite3, sys, time\n" +
      "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n" +
      "db.execute('BEGIN EXCLUSIVE')\n" +
      "print('locked', flush=True)\n" +
      "time.sleep(float(sys.argv[2]))\n" +
      "db.execute('ROLLBACK')\n";
    const child = spawn(PYTHON, ["-c", script, join(this.home, "charter.db"), String(seconds)], { stdio: ["ignore", "pipe", "inherit"] });
    const released = new Promise<void>((done) => child.once("exit", () => done()));
    if ((await firstLine(child)) !== "locked") throw new Error("the store's lock was not taken");
    return { released };
  }

  env(): NodeJS.ProcessEnv {
    return { ...process.env, PYTHONPATH: FIXTURES, CHARTER_TS_SANDBOX: this.sandbox };
  }

  async stop(): Promise<void> {
    await Promise.all(this.#children.map(stopChild));
    await rm(this.home, { recursive: true, force: true });
  }
}

/**
 * Start the sandbox, prepare a store, serve it; the world, once the server
 * says it serves. `busyTimeoutSeconds` shortens the store's busy wait, so that a
 * test holding the store's lock sees `503 store_busy` soon.
 */
export async function startWorld(options: { busyTimeoutSeconds?: number } = {}): Promise<World> {
  const home = await mkdtemp(join(tmpdir(), "charter-ts-"));
  const children: ChildProcess[] = [];
  try {
    const sandboxChild = spawn(CHARTER, ["sandbox", "--port", "0", "--data", join(home, "sandbox.db"), "--json"], { stdio: ["ignore", "pipe", "inherit"] });
    children.push(sandboxChild);
    const sandbox = (JSON.parse(await firstLine(sandboxChild)) as { url: string }).url;
    const env = { ...process.env, PYTHONPATH: FIXTURES, CHARTER_TS_SANDBOX: sandbox };
    const busy = options.busyTimeoutSeconds === undefined ? [] : [String(options.busyTimeoutSeconds)];
    const { stdout } = await run(PYTHON, [join(FIXTURES, "ts_fixture.py"), "prepare", home, sandbox, ...busy], { env });
    const fixture = JSON.parse(stdout) as Fixture;
    const server = spawn(
      CHARTER,
      ["serve", "--store", join(home, "charter.db"), "--config", join(home, "charter.toml"), "--port", "0"],
      { stdio: ["ignore", "pipe", "inherit"], env },
    );
    children.push(server);
    // Port 0: the server binds a port the system chooses and prints it once it
    // serves (a port chosen here and bound later could be taken in between).
    const url = /^serving (http:\/\/\S+)\/api\/v1 /.exec(await firstLine(server))?.[1];
    if (url === undefined) throw new Error("charter serve did not say where it serves");
    return new World(home, url, sandbox, fixture, children);
  } catch (error) {
    await Promise.all(children.map(stopChild));
    await rm(home, { recursive: true, force: true });
    throw error;
  }
}

/**
 * Wait until `check` holds, or fail saying `what` did not happen. Generous: the
 * agents it waits for are fresh Node processes loading their framework, and CI
 * runs this suite at a lower priority beside the Python suite on two cores.
 */
export async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const end = performance.now() + 60_000;
  while (!(await check())) {
    if (performance.now() >= end) throw new Error(`${what}: not within 60 s`);
    await new Promise((done) => setTimeout(done, 50));
  }
}

async function firstLine(child: ChildProcess): Promise<string> {
  if (child.stdout === null) throw new Error("no stdout to read");
  const lines = createInterface({ input: child.stdout });
  for await (const line of lines) return line;
  throw new Error(`the process ended before printing a line (exit ${child.exitCode})`);
}

/** A loopback port nothing listens on (it was free a moment ago). */
export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      probe.close(() => done(port));
    });
  });
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const ended = new Promise((done) => child.once("exit", done));
  child.kill("SIGTERM");
  const late = setTimeout(() => child.kill("SIGKILL"), 5_000);
  await ended;
  clearTimeout(late);
}
