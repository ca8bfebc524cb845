'use strict';
// ferrolock: distributed locks over Redis (one node, or Redlock over several).
const errors = require('./lib/errors');
const { LockManager, withLock } = require('./lib/manager');
const { Lock } = require('./lib/lock');

module.exports = {
  withLock,
  LockManager,
  Lock,
  LockError: errors.LockError,
  InvalidArgumentError: errors.InvalidArgumentError,
  NotAcquiredError: errors.NotAcquiredError,
  NotHeldError: errors.NotHeldError,
  LockLostError: errors.LockLostError,
  QuorumUnreachableError: errors.QuorumUnreachableError,
  RedisError: errors.RedisError,
  AbortError: errors.AbortError,
};
