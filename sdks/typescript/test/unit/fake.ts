/**
 * An in-process `fetch` that answers as `charter serve` answers the remote
 * attempt protocol (docs/protocol.md), for the tests that run without Python:
 * runs claimed and taken over by epoch, claims checked, the node journal, an
 * admission that sends, replays or blocks by effect key, reports idempotent by
 * attempt id and late after a takeover, and the engine's error bodies. Faults
 * are armed per request: a busy store (503 store_busy, nothing written), an
 * answer lost after the request was acted on, no answer at all, a request
 * that hangs until its signal aborts, or any answer given as is. What it
 * holds is read back by the tests: every request, every attempt, every
 * settlement.
 */

type Body = Record<string, unknown>;

export interface Seen {
  method: string;
  path: string;
  body: Body;
}

interface FakeRun {
  id: string;
  mission: string;
  epoch: number;
  segment: string;
  claim: string;
  status: string;
  nodes: Map<string, { execution: number; status: string; result?: string }>;
}

export interface FakeAttempt {
  id: string;
  run: string;
  key: string;
  status: string;
  dispatchedEpoch: number;
  /** Reports received, late ones included. */
  reports: Body[];
  /** How many times a report settled it: never more than once. */
  settlements: number;
  /** Reports kept as late evidence. */
  late: Body[];
}

/** What a fault does to the request it matches. */
export type Fault =
  | { kind: "busy" }
  | { kind: "drop" } // acted on, then the answer lost
  | { kind: "refuse" } // no answer, nothing acted on
  | { kind: "hang" } // until the request's signal aborts
  | { kind: "answer"; status: number; body: unknown }
  | { kind: "then"; run: () => void }; // acted on, then `run` (a takeover, an abort) before it answers

interface Armed {
  method: string;
  path: RegExp;
  fault: Fault;
  times: number;
}

const error = (status: number, code: string, message: string, details: Body = {}): { status: number; body: unknown } => ({
  status,
  body: { error: { code, message, ...details } },
});

export class FakeServer {
  readonly url = "http://charter.test";
  readonly seen: Seen[] = [];
  readonly runs = new Map<string, FakeRun>();
  readonly attempts = new Map<string, FakeAttempt>();
  readonly #armed: Armed[] = [];
  #ids = 0;

  /** Arm `fault` for the next `times` requests of `method` whose path matches `path`. */
  arm(method: string, path: RegExp, fault: Fault, times = 1): void {
    this.#armed.push({ method, path, fault, times });
  }

  /** Another process takes the run over: a new epoch and owner; the old claim is fenced. */
  takeOver(runId: string): void {
    const run = this.#run(runId);
    run.epoch += 1;
    run.segment = `other-${run.epoch}`;
    run.claim = this.#id("clm");
    for (const attempt of this.attempts.values()) {
      if (attempt.run === runId && attempt.status === "dispatched") attempt.status = "unknown"; // R4
    }
  }

  /** The requests seen for a method and a path pattern. */
  count(method: string, path: RegExp): number {
    return this.seen.filter((s) => s.method === method && path.test(s.path)).length;
  }

  readonly fetch = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const method = init.method ?? "GET";
    const path = url.pathname.replace(/^\/api\/v1/, "");
    const body = (typeof init.body === "string" ? JSON.parse(init.body) : {}) as Body;
    this.seen.push({ method, path, body });
    const signal = init.signal ?? undefined;
    signal?.throwIfAborted();
    const fault = this.#fault(method, path);
    if (fault?.kind === "busy") return reply(error(503, "store_busy", "the store is busy: try again"));
    if (fault?.kind === "refuse") throw new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
    if (fault?.kind === "answer") return reply({ status: fault.status, body: fault.body });
    if (fault?.kind === "hang") {
      return new Promise((_, fail) => {
        if (signal === undefined) return;
        signal.addEventListener("abort", () => fail(signal.reason), { once: true });
      });
    }
    const answer = this.#route(method, path, body);
    if (fault?.kind === "drop") throw new TypeError("fetch failed", { cause: new Error("other side closed") });
    if (fault?.kind === "then") fault.run();
    return reply(answer);
  };

  #fault(method: string, path: string): Fault | undefined {
    const armed = this.#armed.find((a) => a.times > 0 && a.method === method && a.path.test(path));
    if (armed === undefined) return undefined;
    armed.times -= 1;
    return armed.fault;
  }

  #id(prefix: string): string {
    this.#ids += 1;
    return `${prefix}_${this.#ids}`;
  }

  #run(runId: string): FakeRun {
    const run = this.runs.get(runId);
    if (run === undefined) throw new Error(`no run ${runId}`);
    return run;
  }

  #claimOf(run: FakeRun): Body {
    return { run_id: run.id, mission_id: run.mission, segment: run.segment, epoch: run.epoch, claim: run.claim, lease_ms: 30_000, status: run.status };
  }

  /** The claim a call as the segment carries, checked as the server checks it (X3). */
  #fenced(run: FakeRun, body: Body): { status: number; body: unknown } | undefined {
    if (body["segment"] === run.segment && body["epoch"] === run.epoch && body["claim"] === run.claim) return undefined;
    return error(409, "fenced", "this segment no longer holds the run", { run_id: run.id, epoch: body["epoch"], current_epoch: run.epoch });
  }

  #route(method: string, path: string, body: Body): { status: number; body: unknown } {
    let m: RegExpExecArray | null;
    if (method === "GET" && path === "/me") return { status: 200, body: { principal: "agent" } };
    if (method === "POST" && (m = /^\/missions\/([^/]+)\/runs$/.exec(path))) {
      const run: FakeRun = {
        id: this.#id("run"), mission: decodeURIComponent(m[1]!), epoch: 1, segment: String(body["segment"]),
        claim: this.#id("clm"), status: "active", nodes: new Map(),
      };
      this.runs.set(run.id, run);
      return { status: 200, body: this.#claimOf(run) };
    }
    if ((m = /^\/runs\/([^/]+)(\/.*)?$/.exec(path))) {
      const run = this.runs.get(decodeURIComponent(m[1]!));
      if (run === undefined) return error(404, "not_found", "no such run");
      return this.#runCall(method, run, m[2] ?? "", body);
    }
    if (method === "POST" && (m = /^\/attempts\/([^/]+)\/report$/.exec(path))) {
      const attempt = this.attempts.get(decodeURIComponent(m[1]!));
      if (attempt === undefined) return error(404, "not_found", "no such attempt");
      return this.#report(attempt, body);
    }
    return error(404, "not_found", `no endpoint ${method} ${path}`);
  }

  #runCall(method: string, run: FakeRun, rest: string, body: Body): { status: number; body: unknown } {
    if (method === "GET" && rest === "") {
      const unresolved = [...this.attempts.values()].filter((a) => a.run === run.id && (a.status === "unknown" || a.status === "dispatched"));
      return {
        status: 200,
        body: {
          run_id: run.id, epoch: run.epoch, status: run.status, status_reason: null, owner_segment: run.segment,
          linked_from: null, contract_version: 1, plan: null, nodes: [], unresolved: unresolved.map((a) => a.id),
          attempts: [], voided: [], settled_counts: {}, waits: [], assessment: {}, next_actions: [],
        },
      };
    }
    if (method === "POST" && rest === "/claim") {
      if (body["segment"] !== run.segment) this.takeOver(run.id);
      run.segment = String(body["segment"]);
      run.claim = this.#id("clm");
      return { status: 200, body: this.#claimOf(run) };
    }
    const fenced = this.#fenced(run, body);
    if (fenced !== undefined) return fenced;
    if (rest === "/renew") return { status: 200, body: { run_id: run.id, segment: run.segment, epoch: run.epoch, lease_ms: 30_000 } };
    if (rest === "/release") return { status: 200, body: { run_id: run.id, released: true } };
    if (rest === "/finish") {
      run.status = String(body["status"] ?? "completed");
      return { status: 200, body: fakeRun(run) };
    }
    let m: RegExpExecArray | null;
    if ((m = /^\/nodes\/([^/]+)\/(start|complete)$/.exec(rest))) {
      const nodeId = decodeURIComponent(m[1]!);
      const node = run.nodes.get(nodeId) ?? { execution: 1, status: "running" };
      run.nodes.set(nodeId, node);
      if (m[2] === "start") return { status: 200, body: { run_id: run.id, node_id: nodeId, execution: node.execution } };
      node.status = "completed";
      node.result = JSON.stringify(body["result"]);
      return { status: 200, body: { run_id: run.id, node_id: nodeId, execution: node.execution, result_hash: `sha256:${node.result.length}` } };
    }
    if (rest === "/attempts") return this.#admit(run, body);
    return error(404, "not_found", `no endpoint ${rest}`);
  }

  #admit(run: FakeRun, body: Body): { status: number; body: unknown } {
    const key = String(body["effect_key"]);
    const before = [...this.attempts.values()].find((a) => a.run === run.id && a.key === key && a.status !== "failed");
    if (before?.status === "succeeded") {
      const last = before.reports.at(-1) ?? {};
      return { status: 200, body: { action: "replay", attempt_id: before.id, status: "succeeded", result: last["result"] ?? null, cost: last["cost"] ?? {}, receipt: null, reason: null } };
    }
    if (before !== undefined) {
      return { status: 200, body: { action: "blocked", attempt_id: before.id, status: before.status, reason: "unresolved" } };
    }
    const attempt: FakeAttempt = {
      id: this.#id("att"), run: run.id, key, status: "dispatched", dispatchedEpoch: run.epoch, reports: [], settlements: 0, late: [],
    };
    this.attempts.set(attempt.id, attempt);
    return {
      status: 200,
      body: {
        action: "send", attempt_id: attempt.id, status: "dispatched", idempotency_key: `charter-${attempt.id}`,
        fencing_token: `${run.id}:${run.epoch}`, send_deadline_ms: 30_000, run_id: run.id, epoch: run.epoch, reason: null,
      },
    };
  }

  #report(attempt: FakeAttempt, body: Body): { status: number; body: unknown } {
    const run = this.#run(attempt.run);
    const { segment: _s, epoch, claim: _c, ...report } = body;
    attempt.reports.push(report);
    if (epoch !== attempt.dispatchedEpoch) return error(409, "fenced", "not the dispatching segment");
    if (run.epoch !== attempt.dispatchedEpoch) {
      attempt.late.push(report); // evidence from a fenced segment, waiting for a person (F2)
      return { status: 200, body: { attempt_id: attempt.id, status: attempt.status, settled: false, late: true } };
    }
    if (attempt.status === "dispatched") {
      const outcome = report["outcome"];
      attempt.status = outcome === "succeeded" ? "succeeded" : outcome === "unknown" ? "unknown" : "failed";
      if (attempt.status !== "unknown") attempt.settlements += 1;
    }
    const settled = attempt.status === "succeeded" || attempt.status === "failed";
    return { status: 200, body: { attempt_id: attempt.id, status: attempt.status, settled, late: false } };
  }
}

function fakeRun(run: FakeRun): Body {
  return {
    id: run.id, mission_id: run.mission, principal: "agent", status: run.status, status_reason: null, epoch: run.epoch,
    owner_segment: run.segment, lease_expires_us: 0, recoveries: 0, linked_from: null, created_at_us: 0, updated_at_us: 0,
  };
}

function reply(answer: { status: number; body: unknown }): Response {
  return new Response(JSON.stringify(answer.body), { status: answer.status, headers: { "content-type": "application/json" } });
}
