/**
 * What the coordinator, the segments and the adapters' reconciliation need of
 * a client: one request and its JSON answer (`Charter.request`), and the
 * escaping of a path segment. Kept apart from the client so that the modules
 * the client is made of depend on this, not on the client itself.
 */

export type Query = Record<string, string | number | boolean | undefined>;

export type Method = "GET" | "POST";

export interface RequestOptions {
  /** The query string's values (`undefined` ones are left out). */
  query?: Query;
  /** Cancels the request and any wait between its tries; the call rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Whether the server answers the same call made twice the same, so that a
   * call that got no answer may be made again (default: true for a GET). A
   * busy store (`store_busy`) is retried either way: it wrote nothing.
   */
  idempotent?: boolean;
}

/** One request to the API; its JSON answer, or the typed error the server answered. */
export interface Requester {
  request(method: Method, path: string, body?: unknown, options?: RequestOptions): Promise<unknown>;
}

/** A path segment, escaped: an ID never changes the path it is put in. */
export function seg(value: string): string {
  return encodeURIComponent(value);
}
