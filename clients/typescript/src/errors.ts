/**
 * An answer the server gave with a status that is not a success, or (status 0, code
 * `network_error`) a request that never got an answer.
 */
export class NaradError extends Error {
  /** The HTTP status; 0 when no answer arrived. */
  readonly status: number;
  /** `error.code` of the JSON error body (`lease_gone`, `acked_ahead_full`, ...). */
  readonly code: string;
  /** The server's `X-Request-Id` for the request, when there was an answer. */
  readonly requestId: string | undefined;
  /** The operation that failed (an OpenAPI operationId). */
  readonly operation: string;
  /** `Retry-After` in milliseconds, when the answer carried one. */
  readonly retryAfterMs: number | undefined;

  constructor(
    status: number,
    code: string,
    message: string,
    init: { operation: string; requestId?: string; retryAfterMs?: number; cause?: unknown },
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "NaradError";
    this.status = status;
    this.code = code;
    this.operation = init.operation;
    this.requestId = init.requestId;
    this.retryAfterMs = init.retryAfterMs;
  }

  /** 410: the lease is no longer yours (or the handle is foreign, or the offset expired). Move on. */
  get gone(): boolean {
    return this.status === 410;
  }

  /** 503 or 429, or no answer at all: the same request may succeed later. */
  get retryable(): boolean {
    return this.status === 503 || this.status === 429 || this.status === 0;
  }
}

/**
 * 410 Gone: the lease lapsed, was settled or redelivered, the handle is foreign, or a replayed
 * offset expired. Not an error to fix: the work may run twice, so move on.
 */
export class GoneError extends NaradError {
  constructor(
    code: string,
    message: string,
    init: { operation: string; requestId?: string; retryAfterMs?: number; cause?: unknown },
  ) {
    super(410, code, message, init);
    this.name = "GoneError";
  }
}
