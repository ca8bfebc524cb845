import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const ferrolock = require('./index.js');

export const {
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
  LockError,
  InvalidArgumentError,
  NotAcquiredError,
  NotHeldError,
  LockLostError,
  QuorumUnreachableError,
  RedisError,
  AbortError,
} = ferrolock;
export default ferrolock;
