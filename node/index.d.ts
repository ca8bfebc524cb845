// ferrolock: distributed locks over Redis. Durations are integer milliseconds.
//
// These declarations compile under lib es2022 alone, without skipLibCheck, and alongside
// lib DOM, esnext.disposable and @types/node: what es2022 lacks is declared here so that it
// merges with those libs' declarations where they are present.

declare global {
  interface SymbolConstructor {
    /** Defined by Node >= 18.18 (explicit resource management): `await using` calls it. */
    readonly asyncDispose: unique symbol;
  }
}

/** The platform's AbortSignal where the program's libs declare one (DOM, @types/node), else
 * the part of it ferrolock reads and hands out. */
type Signal = typeof globalThis extends { AbortSignal: { prototype: infer S } } ? S : SignalLike;
interface SignalLike {
  readonly aborted: boolean;
  readonly reason: any;
  throwIfAborted(): void;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/** Options of a lock; a LockManager's are the defaults of each acquire. An option given as
 * undefined is left out (also under exactOptionalPropertyTypes). */
export interface LockOptions {
  /** The lease on each node, ms (at least 100); the watchdog renews it every ttl/3. Default 10000. */
  ttl?: number | undefined;
  /** ms to wait for the lock: omitted, null or Infinity blocks until acquired; 0 tries once. */
  wait?: number | null | undefined;
  /** Between attempts, ms (jittered ±50 %). Default 100. */
  retryDelay?: number | undefined;
  /** Per node, per request, ms. Default min(200, ttl/10). An acquire whose 2 × nodeTimeout is not under ttl/3 is refused. */
  nodeTimeout?: number | null | undefined;
  /** drift = ttl × driftFactor + 2 ms. Default 0.01. */
  driftFactor?: number | undefined;
  /** Renew the lock while held. Default true. */
  watchdog?: boolean | undefined;
  /** The watchdog stops renewing (and signals loss) after this many ms. Default none. */
  maxHold?: number | null | undefined;
  /** Cap on manual extends. Default none. */
  maxExtensions?: number | null | undefined;
  /**
   * Redisson-compatible hash lock. The owner is the enclosing `withLock` scope while its
   * callback runs: every task it starts, concurrent ones included, re-enters; once the
   * callback has settled the scope owns nothing. Outside a scope, each acquire is a new owner.
   * Default false.
   */
  reentrant?: boolean | undefined;
  /** Every grant carries a fence token. Default false. */
  fencing?: boolean | undefined;
}

/** How a manager reaches its nodes, plus the default options of its locks. */
export interface ManagerOptions extends LockOptions {
  /**
   * Node URLs (an array, read-only ones too: it is copied, never written; or a comma-separated
   * string); default FERROLOCK_NODES, else redis://127.0.0.1:6379.
   */
  nodes?: readonly string[] | string | undefined;
  /** CA file for rediss:// nodes; default FERROLOCK_TLS_CA, else the system roots. */
  tlsCa?: string | null | undefined;
  /**
   * ms after a node's (re)start in which its vote does not count; 0 = off. Default with 3 nodes
   * or more: the longest ttl this manager has been asked for (its own, or a longer one given to
   * an acquire, extend or withLock); set it when other processes use longer ttls on the keys.
   */
  restartGuard?: number | null | undefined;
  /** On a Redis Cluster 7.0+, wake-ups over sharded pub/sub (default true); false = classic. */
  shardedPubsub?: boolean | undefined;
}

export interface AcquireOptions extends LockOptions {
  /**
   * Governs the wait only: aborting it rejects with AbortError, and only once nothing of the
   * wait (key, queue entry) is left on any node that answered, so another client may take the
   * key at once. A grant that came first is released before the rejection.
   */
  signal?: Signal | undefined;
}

export interface WithLockOptions extends ManagerOptions {
  /**
   * Governs the wait only (aborting it leaves nothing, as AcquireOptions.signal); once
   * granted, watch it yourself in the callback.
   */
  signal?: Signal | undefined;
}

/**
 * A held lock. Release it (`withLock` does); one the garbage collector takes unreleased is
 * released then, with a warning naming its key, and that can be before the work it guards
 * has ended: keep a reference until `release()`.
 */
export declare class Lock {
  private constructor();
  readonly key: string;
  /** The value stored at the key (a reentrant lock's hash field). */
  readonly token: string;
  /** The fence token when `fencing: true`, else null. Fences stay below 2^53. */
  readonly fence: number | null;
  /** ms left before the validity ends; 0 once released or lost. */
  readonly validity: number;
  readonly status: 'held' | 'released' | 'lost';
  /**
   * Aborted with a LockLostError reason on loss, at the latest when `status` reads 'lost'
   * (also when first read after the loss). Once read (even only `.aborted`), it keeps the event
   * loop alive until the lock is released or lost: a script that reads it must release the lock
   * (or lose it) to exit.
   */
  readonly signal: Signal;
  /**
   * Renews the lease on a quorum (`ttl` ms sets a new one); resolves to the new validity in ms.
   * No node's expiry is shortened: a shorter ttl takes effect there as the longer one runs
   * down. On failure the validity is unchanged.
   */
  extend(ttl?: number): Promise<number>;
  /**
   * true once released on a quorum, false if the token was already gone (expired or taken).
   * Rejects with NotHeldError if this lock was released already, and with
   * QuorumUnreachableError when too few nodes answered (they keep the key until its ttl).
   */
  release(): Promise<boolean>;
  /**
   * `await using`: releases the lock (as `release()`) unless it is released already or a
   * release of it already ran (a lost lock stays 'lost'): disposing again is a no-op.
   */
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class LockManager {
  constructor(options?: ManagerOptions);
  readonly nodes: string[];
  readonly quorum: number;
  readonly closed: boolean;
  acquire(key: string, options?: AcquireOptions): Promise<Lock>;
  /** Tries once; rejects with NotAcquiredError if held elsewhere. */
  tryAcquire(key: string, options?: Omit<AcquireOptions, 'wait'>): Promise<Lock>;
  /**
   * The read side of the read-write lock `key` (Redisson's RReadWriteLock layout): shared
   * with other readers, excluded by a writer. `ttl` at most 30000 ms; `fencing` is refused
   * (fence tokens go to writers only).
   */
  acquireRead(key: string, options?: AcquireOptions): Promise<Lock>;
  /** Tries the read side once; rejects with NotAcquiredError while a writer holds `key`. */
  tryAcquireRead(key: string, options?: Omit<AcquireOptions, 'wait'>): Promise<Lock>;
  /** The write side of the read-write lock `key`: alone; with `fencing`, each grant has a fence. */
  acquireWrite(key: string, options?: AcquireOptions): Promise<Lock>;
  /** Tries the write side once; rejects with NotAcquiredError while anyone holds `key`. */
  tryAcquireWrite(key: string, options?: Omit<AcquireOptions, 'wait'>): Promise<Lock>;
  /**
   * `count` (default 1) permits of the semaphore `name`, a pool of `permits` (Redisson's
   * RPermitExpirableSemaphore layout): at most `permits` are held at once. Each permit is
   * leased for `ttl` and renewed like a lock; release returns exactly what this holder took.
   * Refused: a different `permits` than the name's pool (naming both), 0, count > permits or 1000, a
   * name with `{` or `}`, a manager of several nodes, `fencing`. Never reentrant.
   */
  acquirePermit(name: string, options: PermitOptions & AcquireOptions): Promise<Lock>;
  /** Tries once; rejects with NotAcquiredError while fewer than `count` permits are free. */
  tryAcquirePermit(name: string, options: PermitOptions & Omit<AcquireOptions, 'wait'>): Promise<Lock>;
  /**
   * Ends the acquires waiting on this manager (they reject with NotAcquiredError, "its
   * manager was closed", leaving nothing on any node that answers), releases the locks it
   * handed out that are still held, then closes. A later call settles with the first.
   */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Runs `fn` holding `key` and resolves to its result. Always releases; rejects with
 * LockLostError if the lock was lost while `fn` ran, even if `fn` resolved, and with the
 * release's error (QuorumUnreachableError, ...) if `fn` resolved but the release failed: `fn`'s
 * work is done then, and the key expires with its ttl. When `fn` throws, its error comes
 * through unchanged and a failed release is only logged.
 */
export declare function withLock<T>(key: string, fn: (lock: Lock) => T | PromiseLike<T>, options?: WithLockOptions): Promise<T>;

/**
 * `withLock` holding the read side of the read-write lock `key` (shared with other readers;
 * `ttl` at most 30000 ms, no `fencing`). Inside a `withReadLock` or `withWriteLock` scope on
 * the same key the scope's owner re-enters; a write under one's own read lock is refused
 * (`INVALID_ARGUMENT`), a read under one's own write lock is granted (a downgrade).
 */
export declare function withReadLock<T>(key: string, fn: (lock: Lock) => T | PromiseLike<T>, options?: WithLockOptions): Promise<T>;
/** `withLock` holding the write side of the read-write lock `key` (alone). */
export declare function withWriteLock<T>(key: string, fn: (lock: Lock) => T | PromiseLike<T>, options?: WithLockOptions): Promise<T>;

/** A semaphore's pool size and how many permits one holder takes. */
export interface PermitOptions {
  /** The pool size (>= 1), set by the first holder of the name; another size is refused. */
  permits: number;
  /** Permits this holder takes, 1..permits. Default 1. */
  count?: number | undefined;
}
/**
 * `withLock` holding `count` permits of the semaphore `name` (see
 * `LockManager.acquirePermit`); the options come before the callback, as they carry the
 * required `permits`.
 */
export declare function withPermit<T>(name: string, options: PermitOptions & WithLockOptions, fn: (lock: Lock) => T | PromiseLike<T>): Promise<T>;

/** A histogram of durations in seconds. */
export interface HistogramMetrics {
  /** The buckets' upper bounds, in seconds; the last is Infinity. */
  le: number[];
  /** Observations at or under each bound. */
  cumulative: number[];
  count: number;
  /** Sum of the observations, in seconds. */
  sum: number;
}

/** The counts of one key prefix (the key up to its last `:`). */
export interface PrefixMetrics {
  /** Acquire attempts sent to the nodes. */
  attempts: number;
  /** Locks granted (re-entries included). */
  grants: number;
  /** Grants to a waiter woken by a release. */
  handoffs: number;
  /** Watchdog renewals confirmed by a quorum. */
  renewals: number;
  renewalFailures: number;
  /** Failed acquires by error code (`NOT_ACQUIRED`, ...). */
  failures: Record<string, number>;
  /** Held locks lost, by reason (`token_gone`, `max_hold`, ...). */
  losses: Record<string, number>;
  /** From an acquire's first attempt to its grant. */
  wait: HistogramMetrics;
  /** From a grant to its release. */
  hold: HistogramMetrics;
}

/** This package's version, "MAJOR.MINOR.PATCH" (the Rust workspace's). */
export declare const version: string;

/** The core's counts for this process (every worker thread included), by key prefix. */
export declare function metrics(): Record<string, PrefixMetrics>;
/** The same counts in Prometheus's text exposition format (`ferrolock_*` names). */
export declare function prometheusText(): string;

export type LogLevel = 'error' | 'warn' | 'info' | 'debug' | 'trace';

/** One log record of the core (or of a `withLock` scope's end). */
export interface LogRecord {
  level: LogLevel;
  /** Where it comes from: `ferrolock::lock`, `ferrolock::node`, `ferrolock::scope`, ... */
  target: string;
  message: string;
}

/**
 * Sends ferrolock's log records at `options.level` (default `'warn'`) and above to `fn`,
 * called on this thread; `null` turns them off. Without a call, warnings and errors are
 * process warnings (`FerrolockWarning`) on the main thread (on a worker's if the main thread
 * has not loaded ferrolock). One logger per process: the last call, in any thread, wins; a
 * worker's lasts as long as the worker (then the latest call of a thread still running is in
 * effect again, or with none the default). At most 1000 records wait for the logger (queued
 * for its thread, or handed to it with its promise not settled): newer ones are dropped, and
 * a warning counting them is its next record once it is done with one.
 */
export declare function setLogger(
  fn: ((record: LogRecord) => void) | null,
  options?: { level?: LogLevel | undefined },
): void;

export type ErrorCode =
  | 'LOCK_ERROR'
  | 'INVALID_ARGUMENT'
  | 'NOT_ACQUIRED'
  | 'NOT_HELD'
  | 'LOCK_LOST'
  | 'QUORUM_UNREACHABLE'
  | 'REDIS_ERROR'
  | 'ABORT_ERR'
  /** A ferrolock bug (a Rust panic inside the call): the process goes on. */
  | 'PANIC';

export declare class LockError extends Error {
  constructor(message: string, options?: { key?: string | undefined; cause?: unknown });
  readonly code: ErrorCode | (string & {});
  readonly key?: string;
  static readonly code: string;
}
export declare class InvalidArgumentError extends LockError {}
export declare class NotAcquiredError extends LockError {}
export declare class NotHeldError extends LockError {}
export declare class LockLostError extends LockError {}
export declare class QuorumUnreachableError extends LockError {}
export declare class RedisError extends LockError {}
/** The caller's AbortSignal stopped a wait: `name === 'AbortError'`, `code === 'ABORT_ERR'`. */
export declare class AbortError extends LockError {}

// Only the names exported above are the module's (not Signal, SignalLike).
export {};
