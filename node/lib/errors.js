'use strict';
// One LockError subclass per error kind of the core's table, each with its stable `code`
// (`err.code === 'LOCK_LOST'`, as Node's own errors carry a code). The native addon sends
// the core's code in front of the message; `fromNative` picks the class by it.

class LockError extends Error {
  constructor(message, options = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = new.target.code ?? 'LOCK_ERROR';
    if (options.key !== undefined) this.key = options.key;
  }
}
LockError.code = 'LOCK_ERROR';

function kind(name, code) {
  const cls = { [name]: class extends LockError {} }[name];
  cls.code = code;
  return cls;
}

const InvalidArgumentError = kind('InvalidArgumentError', 'INVALID_ARGUMENT');
const NotAcquiredError = kind('NotAcquiredError', 'NOT_ACQUIRED');
const NotHeldError = kind('NotHeldError', 'NOT_HELD');
const LockLostError = kind('LockLostError', 'LOCK_LOST');
const QuorumUnreachableError = kind('QuorumUnreachableError', 'QUORUM_UNREACHABLE');
const RedisError = kind('RedisError', 'REDIS_ERROR');

/** The caller's AbortSignal stopped a wait (the core's cancellation). Compatible with the
 * platform's AbortError: `name === 'AbortError'`, `code === 'ABORT_ERR'`. */
class AbortError extends LockError {
  constructor(message, options) {
    super(message, options);
    this.name = 'AbortError';
  }
}
AbortError.code = 'ABORT_ERR';

const BY_CODE = new Map(
  [InvalidArgumentError, NotAcquiredError, NotHeldError, LockLostError, QuorumUnreachableError, RedisError].map(
    (c) => [c.code, c],
  ),
);
BY_CODE.set('CANCELLED', AbortError);

const SEP = '\u001f';

/** A LockError of the class for `code` (a kind the core adds later maps to LockError). */
function fromCode(code, message, key, cause) {
  const cls = BY_CODE.get(code) ?? LockError;
  const err = new cls(message, { key, cause });
  if (cls === LockError) err.code = code;
  return err;
}

// The core's messages spell options as the core does (tls_ca, drift_factor); a JavaScript
// caller wrote tlsCa, driftFactor. Quoted text (keys, values as written) is left as it is.
// Every core message a caller meets goes through it: errors, loss reasons (`max_hold=...`),
// log records.
let jsNames;
function inJsNames(message) {
  jsNames ??= new Map(
    require('./native')
      .optionTable()
      .filter((row) => row.core !== row.name)
      .map((row) => [row.core, row.name]),
  );
  // Not inside a path, host or URL either (`/run/secrets/tls_ca`, `node_timeout.internal`).
  return message.replace(/"(?:[^"\\]|\\.)*"|(?<![\w/.:@-])[a-z]+(?:_[a-z]+)+(?![\w/.:@-])/g, (m) => jsNames.get(m) ?? m);
}

/** Whether `message` quotes `key`, as JavaScript does or as the core does (they differ on a
 * control or invisible character: `"k\u0001"` and `"k\u{1}"`). */
function names(message, key) {
  return message.includes(JSON.stringify(key)) || message.includes(require('./native').quoteKey(key));
}

/** `key` as a message quotes it: as JavaScript does, unless it is too long to show whole; then
 * as the core shows it (its start and its length), not the whole of a key Redis takes up to
 * 512 MB. */
function quoted(key) {
  const core = require('./native').quoteKey(key);
  // The core quotes a key it shows whole (it ends with the quote), a long one by its length.
  return core.endsWith('"') ? JSON.stringify(key) : core;
}

/** An error thrown by the native addon, as the LockError of its kind. `subject` names what
 * `key` is ('lock', or 'semaphore' for a semaphore's name). */
function fromNative(e, key, subject = 'lock') {
  if (e instanceof Error && typeof e.message === 'string') {
    const at = e.message.indexOf(SEP);
    if (at > 0) {
      const code = e.message.slice(0, at);
      let message = inJsNames(e.message.slice(at + 1));
      // The core's option errors name the option, not the key the caller was locking.
      if (key !== undefined && !names(message, key)) message = `${subject} ${quoted(key)}: ${message}`;
      return fromCode(code, message, key);
    }
  }
  return e;
}

module.exports = {
  LockError,
  InvalidArgumentError,
  NotAcquiredError,
  NotHeldError,
  LockLostError,
  QuorumUnreachableError,
  RedisError,
  AbortError,
  fromCode,
  fromNative,
  inJsNames,
  quoted,
};
