/**
 * When the client asks again, and how long it waits first (docs/protocol.md,
 * "Conventions"): a `503 store_busy` wrote nothing and is to be tried again,
 * whatever the call; a call the server answers the same when repeated (a
 * read, a report, a renewal, a node's start or completion) is tried again
 * after no answer, or after a gateway's 502/503/504 without the engine's
 * error body. Anything else — above all a decision (an admission, a claim, a
 * confirmation) that got no answer — is never repeated on a guess: whether
 * the server acted is unknown, and the caller reads the state again.
 */

export interface RetryPolicy {
  /** Tries after the first (default 2; 0 turns retrying off). */
  maxRetries?: number;
  /** The wait before the first retry (default 250 ms). */
  initialDelayMs?: number;
  /** What each wait is multiplied by (default 2). */
  backoffFactor?: number;
  /** The longest wait (default 4 s). */
  maxDelayMs?: number;
}

export const DEFAULT_RETRY: Readonly<Required<RetryPolicy>> = Object.freeze({
  maxRetries: 2,
  initialDelayMs: 250,
  backoffFactor: 2,
  maxDelayMs: 4_000,
});

/** `policy` with its defaults, checked: a negative or fractional count is a mistake. */
export function retryPolicy(policy: RetryPolicy | false | undefined): Required<RetryPolicy> {
  if (policy === false) return { ...DEFAULT_RETRY, maxRetries: 0 };
  const full = { ...DEFAULT_RETRY, ...policy };
  if (!Number.isSafeInteger(full.maxRetries) || full.maxRetries < 0) {
    throw new RangeError(`retry.maxRetries must be a whole number of at least 0, got ${full.maxRetries}`);
  }
  for (const name of ["initialDelayMs", "backoffFactor", "maxDelayMs"] as const) {
    if (!Number.isFinite(full[name]) || full[name] < 0) {
      throw new RangeError(`retry.${name} must be a number of at least 0, got ${full[name]}`);
    }
  }
  return full;
}

/**
 * The wait before retry number `retry` (0 for the first): exponential, capped,
 * with half of it random so that clients a busy store turned away together do
 * not come back together.
 */
export function backoff(policy: Required<RetryPolicy>, retry: number): number {
  const full = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.backoffFactor ** retry);
  return full / 2 + (Math.random() * full) / 2;
}

/** Wait `ms`, or reject with `signal`'s reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((done, fail) => {
    if (signal?.aborted) {
      fail(signal.reason);
      return;
    }
    const abort = (): void => {
      clearTimeout(timer);
      fail(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      done();
    }, ms);
    signal?.addEventListener("abort", abort, { once: true });
  });
}
