'use strict';
// ferrolock: distributed locks over Redis (one node, or Redlock over several).
const errors = require('./lib/errors');
const { LockManager, withLock, withPermit, withReadLock, withWriteLock } = require('./lib/manager');
const { Lock } = require('./lib/lock');
const native = require('./lib/native');
const { setLogger } = require('./lib/log');

/** This package's version (the workspace's; scripts/check-version.sh keeps them equal). */
const { version } = require('./package.json');

/** The core's counts for this process (every worker thread included), by key prefix. */
function metrics() {
  // Defined, not assigned: a prefix `__proto__` is an entry like any other.
  return Object.fromEntries(native.metrics().map((e) => [e.prefix, e.counts]));
}

/** The same counts in Prometheus's text exposition format (`ferrolock_*`). */
function prometheusText() {
  return native.prometheusText();
}

module.exports = {
  version,
  withLock,
  withPermit,
  withReadLock,
  withWriteLock,
  LockManager,
  Lock,
  metrics,
  prometheusText,
  setLogger,
  LockError: errors.LockError,
  InvalidArgumentError: errors.InvalidArgumentError,
  NotAcquiredError: errors.NotAcquiredError,
  NotHeldError: errors.NotHeldError,
  LockLostError: errors.LockLostError,
  QuorumUnreachableError: errors.QuorumUnreachableError,
  RedisError: errors.RedisError,
  AbortError: errors.AbortError,
};
