// Typed errors. Every error this package throws or aborts a signal with is
// a LockdError; one that came from the server is the subclass of its API
// code (lock_held → LockHeldError, ...), so `instanceof` tells them apart.
// Errors the client decides on its own (a local lease that ran out, a lock
// released or lost, the client closed) have classes of their own.

/** Extra facts an error may carry. */
export interface LockdErrorDetails {
  /** The API error code (lock_held, wait_timeout, ...) or the client's own. */
  code?: string;
  /** The HTTP status of an HTTP reply; undefined for a WebSocket reply. */
  status?: number;
  /** The lock the error is about, when the server or the client names one. */
  lock?: string;
  /** The holder a lock_held refusal names ("" when the lock is free but not for a newcomer). */
  holder?: string;
  /** The leader's HTTP URL a not_leader reply named. */
  leader?: string;
  /** How long the server asked to wait before a retry (Retry-After), in ms. */
  retryAfterMs?: number;
  /**
   * The acquire was re-sent after its connection failed, so an earlier
   * send may have been granted, and that grant ended (its TTL or the
   * session ran out) before the client could hear of it. The caller does
   * not hold the lock either way.
   */
  maybeGrantedLost?: boolean;
  cause?: unknown;
}

/** The base class of every error of this package. */
export class LockdError extends Error {
  override name = "LockdError";
  /** The API error code, or the client's own code for errors it decides. */
  readonly code: string;
  readonly status: number | undefined;
  readonly lock: string | undefined;
  readonly leader: string | undefined;
  readonly retryAfterMs: number | undefined;
  readonly maybeGrantedLost: boolean;

  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.code = details.code ?? "unknown";
    this.status = details.status;
    this.lock = details.lock;
    this.leader = details.leader;
    this.retryAfterMs = details.retryAfterMs;
    this.maybeGrantedLost = details.maybeGrantedLost ?? false;
  }
}

// --- errors of the API's codes ---

/** 400 invalid_argument: a field breaks the limits; nothing changed. Also a bad option caught before sending. */
export class InvalidArgumentError extends LockdError {
  override name = "InvalidArgumentError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "invalid_argument", ...details });
  }
}
/** 401 unauthenticated: the cluster wants a valid bearer token. Never retried. */
export class UnauthenticatedError extends LockdError {
  override name = "UnauthenticatedError";
}
/** 403 permission_denied: the token lacks the access the call needs (or a host or session check refused it). Never retried. */
export class PermissionDeniedError extends LockdError {
  override name = "PermissionDeniedError";
}
/** 404 not_found. */
export class NotFoundError extends LockdError {
  override name = "NotFoundError";
}
/** 404 session_expired: the session ended on the server. */
export class SessionExpiredError extends LockdError {
  override name = "SessionExpiredError";
}
/** 405 method_not_allowed. */
export class MethodNotAllowedError extends LockdError {
  override name = "MethodNotAllowedError";
}
/**
 * 409 lock_held: the lock cannot be granted now and the call did not wait.
 * holder names the holder with the lowest token ("" when the lock is free
 * but not for a newcomer: a waiter ahead, or a lock-delay). byThisClient
 * says the lock is held (or being acquired) by this very Client.
 */
export class LockHeldError extends LockdError {
  override name = "LockHeldError";
  readonly holder: string;
  readonly byThisClient: boolean;
  constructor(message: string, details: LockdErrorDetails & { byThisClient?: boolean } = {}) {
    super(message, { code: "lock_held", ...details });
    this.holder = details.holder ?? "";
    this.byThisClient = details.byThisClient ?? false;
  }
}
/** 409 wait_timeout: the wait for the lock ended before it was granted. */
export class WaitTimeoutError extends LockdError {
  override name = "WaitTimeoutError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "wait_timeout", ...details });
  }
}
/** 409 not_holder: the lock is not held with this token any more (released, expired, revoked). */
export class NotHolderError extends LockdError {
  override name = "NotHolderError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "not_holder", ...details });
  }
}
/** 409 limit_mismatch: the lock is of another kind (another semaphore size, or shared on a semaphore). */
export class LimitMismatchError extends LockdError {
  override name = "LimitMismatchError";
}
/** 409 cancelled: the queued wait was withdrawn (POST .../cancel, or a WebSocket cancel). */
export class CancelledError extends LockdError {
  override name = "CancelledError";
}
/** 413 payload_too_large. */
export class PayloadTooLargeError extends LockdError {
  override name = "PayloadTooLargeError";
}
/** 429 resource_exhausted: a quota is used up (the message names it). Nothing changed. */
export class ResourceExhaustedError extends LockdError {
  override name = "ResourceExhaustedError";
}
/** 500 internal. */
export class InternalError extends LockdError {
  override name = "InternalError";
}
/** 503 no_leader (or a WebSocket not_leader): no leader could be reached, or a call's outcome is unknown because leadership moved. */
export class NoLeaderError extends LockdError {
  override name = "NoLeaderError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "no_leader", ...details });
  }
}
/** 503 overloaded: the member refused new work early; retried with backoff, honouring retryAfterMs. */
export class OverloadedError extends LockdError {
  override name = "OverloadedError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "overloaded", ...details });
  }
}

// --- errors the client decides on its own ---

/**
 * The client's conservative local lease ran out: no keepalive (or renew,
 * for a lock with a TTL of its own) sent early enough was confirmed, so the
 * server may already have given the lock to someone else.
 */
export class LeaseExpiredError extends LockdError {
  override name = "LeaseExpiredError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "lease_expired", ...details });
  }
}
/** The server expired the lock's own TTL (a `lost` push with reason expired). */
export class LockExpiredError extends LockdError {
  override name = "LockExpiredError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "lock_expired", ...details });
  }
}
/** The grant was revoked (DELETE /api/v1/locks/{name}; a `lost` push with reason revoked). */
export class RevokedError extends LockdError {
  override name = "RevokedError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "revoked", ...details });
  }
}
/** The lock was released by this client. */
export class ReleasedError extends LockdError {
  override name = "ReleasedError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "released", ...details });
  }
}
/** The Client was closed. */
export class ClosedError extends LockdError {
  override name = "ClosedError";
  constructor(message = "lockd: client closed", details: LockdErrorDetails = {}) {
    super(message, { code: "closed", ...details });
  }
}
/**
 * A request was sent but no answer came (the connection broke, the call
 * was aborted): the server may or may not have applied it. A release that
 * ends so counts the lock as gone, and the client goes on releasing it in
 * the background.
 */
export class UnknownOutcomeError extends LockdError {
  override name = "UnknownOutcomeError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "unknown_outcome", ...details });
  }
}
/** proclaim (or a check) by a candidate that does not lead: never elected, resigned, or its leadership was lost. */
export class ElectionNotLeaderError extends LockdError {
  override name = "ElectionNotLeaderError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "election_not_leader", ...details });
  }
}
/** Election.leader found nobody leading. */
export class ElectionNoLeaderError extends LockdError {
  override name = "ElectionNoLeaderError";
  constructor(message: string, details: LockdErrorDetails = {}) {
    super(message, { code: "election_no_leader", ...details });
  }
}
/**
 * A member sent the client (a 307, or a WebSocket not_leader) where it
 * does not send its token: to a host that is neither a configured endpoint
 * nor a leader one of them named, or from https to http. Nothing was sent
 * there.
 */
export class UntrustedRedirectError extends LockdError {
  override name = "UntrustedRedirectError";
  /** Asking again cannot help: a configured endpoint sent it, or it leaves https. */
  readonly fatal: boolean;
  constructor(message: string, fatal: boolean) {
    super(message, { code: "untrusted_redirect" });
    this.fatal = fatal;
  }
}
/** An http:// endpoint reached a member that serves HTTPS: use https:// and trust its CA. */
export class HTTPSRequiredError extends LockdError {
  override name = "HTTPSRequiredError";
  constructor(message: string) {
    super(message, { code: "https_required" });
  }
}

type ErrorClass = new (message: string, details?: LockdErrorDetails) => LockdError;

const byCode: Record<string, ErrorClass> = {
  invalid_argument: InvalidArgumentError,
  unauthenticated: UnauthenticatedError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  session_expired: SessionExpiredError,
  method_not_allowed: MethodNotAllowedError,
  lock_held: LockHeldError,
  wait_timeout: WaitTimeoutError,
  not_holder: NotHolderError,
  limit_mismatch: LimitMismatchError,
  cancelled: CancelledError,
  payload_too_large: PayloadTooLargeError,
  resource_exhausted: ResourceExhaustedError,
  internal: InternalError,
  no_leader: NoLeaderError,
  not_leader: NoLeaderError,
  overloaded: OverloadedError,
};

/** The API error codes this package has a class for. */
export const apiErrorCodes: readonly string[] = Object.keys(byCode);

/**
 * serverError builds the error of an error reply: the class of its code
 * (LockdError for a code this package does not know), with the message
 * prefixed "lockd: <code>: ".
 */
export function serverError(code: string, message: string, details: Omit<LockdErrorDetails, "code"> = {}): LockdError {
  const cls = byCode[code] ?? LockdError;
  let text = `lockd: ${code}`;
  if (message) text += `: ${message}`;
  if (code === "lock_held" && details.holder && !message.includes(details.holder)) {
    text += ` (held by ${details.holder})`;
  }
  return new cls(text, { ...details, code });
}

/** codeForStatus is the code an HTTP status implies when a reply's body names none. */
export function codeForStatus(status: number): string {
  switch (status) {
    case 400:
      return "invalid_argument";
    case 401:
      return "unauthenticated";
    case 403:
      return "permission_denied";
    case 404:
      return "not_found";
    case 405:
      return "method_not_allowed";
    case 413:
      return "payload_too_large";
    case 429:
      return "resource_exhausted";
    case 503:
      return "no_leader";
  }
  return "internal";
}

/** isAuthError reports a refused token or access: retrying cannot help. */
export function isAuthError(err: unknown): boolean {
  return err instanceof UnauthenticatedError || err instanceof PermissionDeniedError;
}
