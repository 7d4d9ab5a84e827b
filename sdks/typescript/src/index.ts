/**
 * Charter's TypeScript SDK: the recovery API with the seed's names
 * (`coordinator.recover(runId, segmentId)`, `coordinator.reconcile(attemptId,
 * adapter)`) and the remote attempt protocol (X1), over Charter's HTTP API.
 */

export { Charter } from "./client.js";
export type { CallOptions, CharterOptions } from "./client.js";
export type { Method, Query, RequestOptions, Requester } from "./transport.js";
export { DEFAULT_RETRY } from "./retry.js";
export type { RetryPolicy } from "./retry.js";
export { Coordinator, RecoveryState } from "./coordinator.js";
export type { ResolveOptions } from "./coordinator.js";
export { Segment, Context } from "./segment.js";
export type { AttemptOptions, SegmentCallOptions } from "./segment.js";
export type { Adapter, Dispatch, Estimate, Evidence, Operation, Outcome } from "./adapter.js";
export * from "./errors.js";
export type * from "./records.js";
