/**
 * The payments sandbox's API as a TypeScript adapter (docs/adapters.md, "The
 * payments sandbox"): `pay` is idempotent by key (the sandbox answers the
 * same key with the first payment and applies nothing), sent with the
 * attempt's fencing token, and looked up by key; a lookup that finds nothing
 * closes the key at the sandbox, so its 404 proves the payment can never apply.
 */

import { NotApplied, OutcomeUnknown } from "../src/index.js";
import type { Adapter, Attempt, Dispatch, Estimate, Evidence, Outcome } from "../src/index.js";

export interface Bill {
  amount: number;
  currency: string;
  payee: string;
  reference: string;
}

/** A payment as the sandbox records it: what `ctx.attempt(payments, "pay", ...)` answers. */
export interface Payment {
  id: string;
  amount: number;
  currency: string;
  reference: string;
  [field: string]: unknown;
}

/** Statuses the sandbox documents as refused before anything was applied. */
const REFUSED = new Set([409, 429]);
/** Statuses HTTP defines as refusals made before processing: the target answered, nothing applied. */
const FAILED = new Set([400, 401, 403, 404, 422]);

export class Payments implements Adapter<Bill, Payment> {
  readonly name = "payments";
  readonly operations = { pay: { effect: "idempotent_keyed" as const, dedupeWindowSeconds: 86_400 } };
  readonly url: string;
  readonly timeoutMs: number;

  constructor(url: string, options: { timeoutMs?: number } = {}) {
    this.url = url.replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? 2_000;
  }

  estimate(operation: string, request: Bill): Estimate {
    return { amounts: { usd_cents: request.amount }, priceSource: "sandbox/amount" };
  }

  async dispatch(send: Dispatch<Bill>): Promise<Outcome<Payment>> {
    const headers = {
      "content-type": "application/json",
      "idempotency-key": send.idempotencyKey,
      "x-fencing-token": send.fencingToken,
    };
    send.checkDeadline(); // the last moment before the bytes go out (F3)
    let answer: Response;
    try {
      answer = await fetch(`${this.url}/v1/payments`, {
        method: "POST",
        headers,
        body: JSON.stringify(send.request),
        signal: AbortSignal.any([send.signal, AbortSignal.timeout(this.timeoutMs)]),
      });
    } catch (error) {
      if (refusedConnection(error)) throw new NotApplied("connection refused: nothing was sent");
      if (send.signal.aborted) throw new OutcomeUnknown("cancelled while the payment was in flight", {}, { cause: error });
      throw new OutcomeUnknown(`no answer: ${String((error as Error).cause ?? error)}`);
    }
    const body: unknown = await answer.json().catch(() => null);
    if (answer.ok) return paid(body);
    if (REFUSED.has(answer.status)) throw new NotApplied(`refused before applying (${answer.status})`, { body });
    if (FAILED.has(answer.status)) return { status: "failed", result: body, receipt: body };
    throw new OutcomeUnknown(`answered ${answer.status}`, { body });
  }

  async lookup(attempt: Attempt, options: { signal?: AbortSignal } = {}): Promise<Evidence> {
    const key = encodeURIComponent(attempt.idempotency_key);
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = options.signal === undefined ? timeout : AbortSignal.any([options.signal, timeout]);
    const answer = await fetch(`${this.url}/v1/payments/by-key/${key}`, { signal });
    const body: unknown = await answer.json().catch(() => null);
    if (answer.ok) return { verdict: "applied", outcome: paid(body), detail: { looked_up: key } };
    if (answer.status === 404) return { verdict: "not_applied", detail: { looked_up: key, closed: true } };
    return { verdict: "indeterminate", detail: { looked_up: key, status: answer.status } };
  }
}

/** A 2xx's body as a payment, checked: anything else leaves the outcome unknown. */
function paid(body: unknown): Outcome<Payment> {
  const payment = body as Partial<Payment> | null;
  if (typeof payment?.amount !== "number" || typeof payment.id !== "string") {
    throw new OutcomeUnknown("a 2xx without the payment's id and amount", { body });
  }
  return { status: "succeeded", result: payment as Payment, cost: { usd_cents: payment.amount }, receipt: body };
}

function refusedConnection(error: unknown): boolean {
  const cause = (error as { cause?: { code?: string } } | null)?.cause;
  return cause?.code === "ECONNREFUSED";
}
