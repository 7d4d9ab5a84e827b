/**
 * What the coordinator and the adapters' reconciliation need of a client: one
 * request and its JSON answer (`Charter.request`), and the escaping of a path
 * segment. Kept apart from the client so that the modules the client is made
 * of depend on this, not on the client itself.
 */

export type Query = Record<string, string | number | boolean | undefined>;

/** One request to the API; its JSON answer, or the typed error the server answered. */
export interface Requester {
  request(method: "GET" | "POST", path: string, body?: unknown, query?: Query): Promise<unknown>;
}

/** A path segment, escaped: an ID never changes the path it is put in. */
export function seg(value: string): string {
  return encodeURIComponent(value);
}
