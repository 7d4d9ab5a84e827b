/**
 * A target for the unit tests' effects, in process: it records what it was
 * sent (key, request, whether it was cut off) and answers with a receipt, so
 * that a test can say what reached it. `hold` keeps a send open until its
 * signal aborts or `release()` is called.
 */

import { NotApplied } from "../../src/index.js";
import type { Adapter, Dispatch, Evidence, Outcome } from "../../src/index.js";

export interface Transfer {
  to: string;
  cents: number;
}

export interface Receipt {
  id: string;
  cents: number;
}

export class Bank implements Adapter<Transfer, Receipt> {
  readonly name = "bank";
  readonly operations = { transfer: { effect: "idempotent_keyed" as const, dedupeWindowSeconds: 3_600 } };
  /** Every send that reached the bank, by idempotency key. */
  readonly received: { key: string; request: Transfer; signal: AbortSignal }[] = [];
  /** Sends cut off by their signal while the bank held them. */
  readonly cut: string[] = [];
  hold = false;
  #release: (() => void) | undefined;
  /** Called as a send starts, before the bank holds it (a test's hook: abort, take over). */
  onSend: (send: Dispatch<Transfer>) => void = () => undefined;

  estimate(_operation: string, request: Transfer): { amounts: Record<string, number> } {
    return { amounts: { usd_cents: request.cents } };
  }

  async dispatch(send: Dispatch<Transfer>): Promise<Outcome<Receipt>> {
    send.checkDeadline();
    if (send.signal.aborted) throw new NotApplied("cancelled before the transfer went out");
    this.onSend(send);
    this.received.push({ key: send.idempotencyKey, request: send.request, signal: send.signal });
    if (this.hold) {
      await new Promise<void>((done, fail) => {
        this.#release = done;
        send.signal.addEventListener("abort", () => {
          this.cut.push(send.idempotencyKey);
          fail(send.signal.reason);
        }, { once: true });
      });
    }
    const receipt = { id: `tx-${this.received.length}`, cents: send.request.cents };
    return { status: "succeeded", result: receipt, cost: { usd_cents: send.request.cents }, receipt };
  }

  release(): void {
    this.#release?.();
  }

  async lookup(): Promise<Evidence> {
    return { verdict: "indeterminate" };
  }
}
