// @lockd/client: the Node.js client of lockd.

export { Client, type AcquireOptions } from "./client.js";
export type { ClientOptions, TLSOptions, Logger, PEM } from "./config.js";
export { Lock, fencingHeaderNames, type CallOptions } from "./lock.js";
export { Election, type LeaderInfo } from "./election.js";
export { Watch, type WatchOptions, type WatchChange } from "./watch.js";
export type { LockStatus, Holder } from "./status.js";
export {
  LockdError,
  type LockdErrorDetails,
  InvalidArgumentError,
  UnauthenticatedError,
  PermissionDeniedError,
  NotFoundError,
  SessionExpiredError,
  MethodNotAllowedError,
  LockHeldError,
  WaitTimeoutError,
  NotHolderError,
  LimitMismatchError,
  CancelledError,
  PayloadTooLargeError,
  ResourceExhaustedError,
  InternalError,
  NoLeaderError,
  OverloadedError,
  LeaseExpiredError,
  LockExpiredError,
  RevokedError,
  ReleasedError,
  ClosedError,
  UnknownOutcomeError,
  ElectionNotLeaderError,
  ElectionNoLeaderError,
  UntrustedRedirectError,
  HTTPSRequiredError,
} from "./errors.js";
