export {
  Client,
  IMPLEMENTED_OPERATIONS,
  decodeMessage,
  duration,
  type BatchMessage,
  type CallOptions,
  type ClientOptions,
  type ConsumeOptions,
  type Duration,
  type NaradMessage,
  type Payload,
  type ProduceOptions,
  type RetryOptions,
  type SettleResult,
  type Subscribed,
} from "./client.js";
export { GoneError, NaradError } from "./errors.js";
export { Worker, type Handler, type Logger, type WorkerContext, type WorkerOptions } from "./worker.js";
export { base64ToBytes, bytesToBase64 } from "./base64.js";
export * from "./openapi.js";
