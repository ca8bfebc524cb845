'use strict';
const { AsyncLocalStorage } = require('node:async_hooks');
const { isMainThread } = require('node:worker_threads');
const native = require('./native');
const { AbortError, InvalidArgumentError, NotAcquiredError, fromCode, fromNative, inJsNames, quoted } = require('./errors');
const { aClass, convert, checkKey, checkSignal, isClass, isRevoked, notOptions, optionNames, splitPermits, tryOnce } = require('./options');
const { Lock } = require('./lock');
const log = require('./log');

// The reentrancy owner is the async context: each withLock scope pushes what it holds.
const scopes = new AsyncLocalStorage();

let exitHook = false;
/** Milliseconds `process.on('exit')` may spend releasing the locks still held. */
const EXIT_LIMIT_MS = 1000;
function hookExit() {
  if (exitHook) return;
  exitHook = true;
  // The main thread's exit is the process's: the host layer's exit protocol releases every
  // lock still held. A worker's exit releases only that worker's locks.
  if (isMainThread) process.on('exit', () => native.exitSync(EXIT_LIMIT_MS));
  else process.on('exit', () => native.releaseEnvSync(EXIT_LIMIT_MS));
}

// One 'abort' listener per caller signal, however many acquires share it (a listener each
// would trip Node's MaxListenersExceededWarning past 10); removed when the last one ends.
const watched = new WeakMap();

function watch(signal, token) {
  let entry = watched.get(signal);
  if (entry === undefined) {
    const tokens = new Set();
    const onAbort = () => {
      for (const t of tokens) t.cancel();
    };
    entry = { tokens, onAbort };
    watched.set(signal, entry);
    signal.addEventListener('abort', onAbort, { once: true });
  }
  entry.tokens.add(token);
}

function unwatch(signal, token) {
  const entry = watched.get(signal);
  if (entry === undefined || !entry.tokens.delete(token) || entry.tokens.size > 0) return;
  watched.delete(signal);
  signal.removeEventListener('abort', entry.onAbort);
}

// `subject`: 'semaphore' for a semaphore's name, as the core's errors of its acquire call it.
function abortError(key, signal, subject = 'lock') {
  return new AbortError(`${subject} ${quoted(key)} not acquired: the wait was aborted by the caller's signal`, {
    key,
    cause: signal.reason,
  });
}

// A core manager's identity (its client uuid) and the servers it reaches, read once per
// native manager.
const ids = new WeakMap();
function managerIdentity(nm) {
  let id = ids.get(nm);
  if (id === undefined) {
    id = { manager: nm.clientId, servers: nm.servers };
    ids.set(nm, id);
  }
  return id;
}
function managerId(nm) {
  return managerIdentity(nm).manager;
}

/** The enclosing scope holding `key` on the same servers, if any (through this core manager
 * or another: options written apart, such as `h:1` and `h:1/0`, make another manager, whose
 * acquire would wait for the scope's lock all the same). A scope whose
 * callback has settled owns nothing: a task it started and left running (a timer, an
 * unawaited promise) acquires as a new owner. Nor does one whose lock is no longer held
 * (lost, or released early): acquiring its key again (say, from the loss listener) waits for
 * whoever holds it now, not for itself. */
function enclosing(nm, key) {
  if (scopes.getStore() === undefined) return undefined;
  const { servers } = managerIdentity(nm);
  for (let s = scopes.getStore(); s; s = s.parent) {
    if (!s.ended && s.key === key && s.servers === servers && s.lock.status === 'held') return s;
  }
  return undefined;
}

/** The innermost scope of `s`'s chain still running, with the ended scopes behind it spliced
 * out (they own nothing, and `ended` never goes back). A job that starts its next run from
 * inside its scope (a timer, setImmediate) runs it in that scope's async context: linked as
 * parents, the ended scopes, and their locks, were kept for the life of the process, and every
 * acquire walked them. */
function live(s) {
  while (s !== undefined && s.ended) s = s.parent;
  for (let t = s; t !== undefined; t = t.parent) {
    let p = t.parent;
    while (p !== undefined && p.ended) p = p.parent;
    t.parent = p;
  }
  return s;
}

/** How many permits of the semaphore `key`, a pool of `permits`, the enclosing scopes of this
 * async context hold on the same servers: they go back only when those scopes end. */
function enclosingPermits(nm, key, permits) {
  const { servers } = managerIdentity(nm);
  let held = 0;
  for (let s = scopes.getStore(); s; s = s.parent) {
    if (!s.ended && s.key === key && s.servers === servers && s.kind === 'semaphore' && s.sem?.permits === permits && s.lock.status === 'held') {
      held += s.sem.count;
    }
  }
  return held;
}

/** The scope function holding a `kind` (null: the lock; 'read', 'write', 'semaphore'), for
 * errors. */
const SCOPE_NAMES = { null: 'withLock', read: 'withReadLock', write: 'withWriteLock', semaphore: 'withPermit' };

/** `opts`: a NativeLockOptions, or null for the manager's defaults. `kind`: null for the
 * lock, 'read' or 'write' for a side of the read-write lock `key`, 'semaphore' for
 * `sem.count` permits of the semaphore `key`, a pool of `sem.permits`. */
async function acquireNative(nm, key, opts, reentrant, signal, kind = null, sem = null) {
  const found = enclosing(nm, key);
  if (kind === 'semaphore' && found && found.kind !== 'semaphore') {
    // A semaphore waits for a lock of its name (the read-write lock's too): here, for ever.
    throw new NotAcquiredError(
      `semaphore ${quoted(key)} not acquired: this async context holds it as a lock (an enclosing ${SCOPE_NAMES[found.kind]}), which a semaphore waits for, so waiting would deadlock`,
      { key },
    );
  }
  if (kind === 'semaphore') {
    // Beside what the enclosing scopes hold, too few permits are left: waiting would be for
    // those scopes, which end only after this wait (`ferrolock run` refuses such a run too).
    const stuck = enclosingPermits(nm, key, sem.permits);
    if (stuck > 0 && sem.count > Math.max(0, sem.permits - stuck)) {
      throw new NotAcquiredError(
        `semaphore ${quoted(key)} not acquired: this async context's enclosing withPermit scopes hold ${stuck} of its ${sem.permits} permits (on the same servers), and this asks for ${sem.count}: they go back only when those scopes end, so waiting would deadlock`,
        { key },
      );
    }
  }
  // A semaphore never re-enters: each acquire is a holder of its own, also inside a scope.
  const held = kind === 'semaphore' ? undefined : found;
  let owner = null;
  if (held && held.manager !== managerId(nm)) {
    // The same servers through other options: another owner, which only waits for itself.
    // What would re-enter instead depends on the pair: a plain lock needs reentrant on both, a
    // read-write hold none, and a plain lock never re-enters a read-write hold (nor the reverse).
    const rw = (k) => k === 'read' || k === 'write';
    let hint = '';
    if (held.kind === null && kind === null) {
      hint = '; only a withLock nested with the same connection options (and reentrant: true on both) re-enters it';
    } else if (rw(held.kind) && rw(kind)) {
      hint = '; only a withReadLock or withWriteLock nested with the same connection options re-enters it';
    }
    throw new NotAcquiredError(
      `lock ${quoted(key)} not acquired: this async context already holds it (an enclosing ${SCOPE_NAMES[held.kind]}, on the same servers through another manager), so waiting would deadlock${hint}`,
      { key },
    );
  } else if (held && (kind === 'read' || kind === 'write') && (held.kind === 'read' || held.kind === 'write')) {
    // A read-write hold is always reentrant for its owner: the core re-enters, downgrades
    // (read under one's write) or refuses an upgrade. Under a withPermit it is refused below,
    // as withLock is: sent to the core, it met the permit counter as a raw RedisError.
    owner = held.owner;
  } else if (held) {
    if (!(held.reentrant && reentrant && held.kind === kind)) {
      const hint = held.kind === kind ? '; pass reentrant: true to both to re-enter' : '';
      throw new NotAcquiredError(
        `lock ${quoted(key)} not acquired: this async context already holds it (an enclosing ${SCOPE_NAMES[held.kind]}), so waiting would deadlock${hint}`,
        { key },
      );
    }
    owner = held.owner;
  } else if (reentrant || kind === 'read' || kind === 'write') {
    owner = native.newOwner();
  }
  const subject = kind === 'semaphore' ? 'semaphore' : 'lock';
  if (signal?.aborted) throw abortError(key, signal, subject);
  let token = null;
  if (signal) {
    token = new native.CancelToken();
    watch(signal, token);
  }
  let inner;
  try {
    inner = await nm.acquire(key, opts, owner, token, kind, sem?.permits, sem?.count);
  } catch (e) {
    const err = fromNative(e, key, subject);
    if (err instanceof AbortError && signal) throw abortError(key, signal, subject);
    throw err;
  } finally {
    if (token) unwatch(signal, token);
  }
  if (signal?.aborted) {
    await inner.release().catch(() => {});
    throw abortError(key, signal, subject);
  }
  return { lock: Lock._make(inner, subject), owner };
}

/** Hands out locks on a fixed set of nodes. Reusable; close() when done. */
class LockManager {
  #native;
  /** The first close()'s promise: a later close() resolves with it, not before it is done. */
  #closing = null;
  constructor(options) {
    const conv = convert(options, undefined, { manager: true, lock: false });
    if (conv.signal) throw new InvalidArgumentError('LockManager: signal is an option of acquire, not of a manager');
    try {
      this.#native = new native.NativeManager(conv.manager);
    } catch (e) {
      throw fromNative(e);
    }
    hookExit();
  }
  /** The nodes, passwords redacted. */
  get nodes() {
    return this.#native.nodes;
  }
  get quorum() {
    return this.#native.quorum;
  }
  get closed() {
    return this.#native.closed;
  }
  /** Acquires `key`; `wait` omitted or Infinity blocks, 0 tries once. */
  async acquire(key, options) {
    return this.#acquire(key, options, null);
  }
  /** Tries once: rejects with NotAcquiredError if the lock is held elsewhere. */
  async tryAcquire(key, options) {
    return this.acquire(key, tryOnce(key, options));
  }
  /** Takes the read side of the read-write lock `key`: shared with other readers. */
  async acquireRead(key, options) {
    return this.#acquire(key, options, 'read');
  }
  /** Tries the read side once: rejects with NotAcquiredError while a writer holds `key`. */
  async tryAcquireRead(key, options) {
    return this.acquireRead(key, tryOnce(key, options));
  }
  /** Takes the write side of the read-write lock `key`: alone. */
  async acquireWrite(key, options) {
    return this.#acquire(key, options, 'write');
  }
  /** Tries the write side once: rejects with NotAcquiredError while anyone holds `key`. */
  async tryAcquireWrite(key, options) {
    return this.acquireWrite(key, tryOnce(key, options));
  }
  /**
   * Takes `count` (default 1) permits of the semaphore `name`, a pool of `permits`; the
   * other options are an acquire's. Each call is a holder of its own (no reentrancy).
   */
  async acquirePermit(name, options) {
    checkKey(name, 'semaphore name');
    const { rest, ...sem } = splitPermits(name, options);
    return this.#acquire(name, rest, 'semaphore', sem);
  }
  /** Tries once: rejects with NotAcquiredError while fewer than `count` permits are free. */
  async tryAcquirePermit(name, options) {
    return this.acquirePermit(name, tryOnce(name, options, 'semaphore'));
  }
  async #acquire(key, options, kind, sem = null) {
    checkKey(key);
    const conv = convert(options, key, {
      manager: false,
      lock: true,
      extra: sem ? ['permits', 'count'] : [],
      subject: sem ? 'semaphore' : 'lock',
    });
    const opts = conv.lock.length ? lockOptions(this.#native, key, conv.lock, sem ? 'semaphore' : 'lock') : null;
    return (await acquireNative(this.#native, key, opts, conv.reentrant, conv.signal, kind, sem)).lock;
  }
  /** Releases the locks this manager handed out that are still held, then closes it. */
  async close() {
    this.#closing ??= this.#close();
    return this.#closing;
  }
  async #close() {
    try {
      await this.#native.close();
    } catch (e) {
      throw fromNative(e);
    }
  }
  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

function lockOptions(nm, key, entries, subject) {
  try {
    return nm.lockOptions(key, entries);
  } catch (e) {
    throw fromNative(e, key, subject);
  }
}

// Shared managers per distinct connection options (the registry itself is the native
// host layer's; this only saves re-converting the same options). `env`: what the options
// leave to the environment (see fromEnv).
const sharedCache = new Map();
function sharedManager(entries, env) {
  const id = JSON.stringify(entries) + env;
  let nm = sharedCache.get(id);
  if (!nm) {
    try {
      nm = native.NativeManager.shared(entries);
    } catch (e) {
      throw fromNative(e);
    }
    sharedCache.set(id, nm);
    hookExit();
  }
  return nm;
}

// withLock's options converted once per distinct content (issue 32: converting and
// JSON.stringify-ing them on every call cost about 20 µs of the JavaScript thread per lock):
// the shared manager, the lock's options checked by the core, and `reentrant`. Looked up by a
// key built from the values (most callers pass a new object literal each time, so an object's
// identity would not find it). `signal` is per call, never part of it. Bounded: past
// PREPARED_MAX distinct contents the cache starts over.
const prepared = new Map();
const PREPARED_MAX = 1000;

/** A string naming `options`' content, or null when a value is not a plain one (those take
 * the full conversion, which also reports what is wrong with them). */
function contentKey(options) {
  let k = '';
  for (const name of optionNames(options)) {
    if (name === 'signal') continue;
    const v = options[name];
    switch (typeof v) {
      case 'undefined':
        continue;
      case 'number':
      case 'boolean':
        k += `${name}=${typeof v}:${v};`;
        continue;
      case 'string':
        k += `${name}=s${v.length}:${v};`;
        continue;
      default:
        if (v === null) {
          k += `${name}=null;`;
          continue;
        }
        if (isRevoked(v) || !Array.isArray(v)) return null;
        k += `${name}=a${v.length}`;
        for (const u of v) {
          if (typeof u !== 'string') return null;
          k += `,${u.length}:${u}`;
        }
        k += ';';
    }
  }
  return k;
}

/** The variables that stand for what `options` leave out (FERROLOCK_NODES, FERROLOCK_TLS_CA), as
 * they are now: the core reads them at each call (Python's redlock() follows a change), so a
 * conversion made under other values is not this one. */
function fromEnv(options) {
  const nodes = options?.nodes == null ? (process.env.FERROLOCK_NODES ?? '') : '';
  const ca = options?.tlsCa == null ? (process.env.FERROLOCK_TLS_CA ?? '') : '';
  return `\u0000${nodes.length}:${nodes};${ca.length}:${ca}`;
}

function withLockOptions(options, key, extra = [], subject = 'lock') {
  const plain = options === undefined || options === null || !notOptions(options);
  const env = plain ? fromEnv(options) : '';
  const id = plain ? (options == null ? '' : contentKey(options)) : null;
  let found = id === null ? undefined : prepared.get(id + env);
  if (found === undefined) {
    const conv = convert(options, key, { manager: true, lock: true, extra, subject });
    const nm = sharedManager(conv.manager, env);
    found = { nm, opts: conv.lock.length ? lockOptions(nm, key, conv.lock, subject) : null, reentrant: conv.reentrant };
    if (id !== null) {
      if (prepared.size >= PREPARED_MAX) prepared.clear();
      prepared.set(id + env, found);
    }
  }
  return found;
}

// withLock and its read/write forms are plain functions handing back withKind's promise: an
// `async` wrapper would add a promise and a microtask to every call (withKind is async, so
// bad input still rejects rather than throws).

/**
 * Runs `fn(lock)` holding `key`; resolves to its result. Always releases; rejects with
 * LockLostError if the lock was lost while `fn` ran, even if `fn` resolved.
 */
function withLock(key, fn, options) {
  return withKind(key, fn, options, null);
}

/** withLock holding the read side of the read-write lock `key` (shared with other readers). */
function withReadLock(key, fn, options) {
  return withKind(key, fn, options, 'read');
}

/** withLock holding the write side of the read-write lock `key` (alone). */
function withWriteLock(key, fn, options) {
  return withKind(key, fn, options, 'write');
}

/**
 * withLock holding `count` (default 1) permits of the semaphore `name`, a pool of `permits`
 * (`options` carries both, with the other options of withLock).
 */
async function withPermit(name, options, fn) {
  checkKey(name, 'semaphore name');
  const { rest, ...sem } = splitPermits(name, options);
  return withKind(name, fn, rest, 'semaphore', sem);
}

async function withKind(key, fn, options, kind, sem = null) {
  checkKey(key);
  // A revoked Proxy of a function is typeof 'function' too, and so is a class: called, each
  // threw a TypeError once the lock was taken.
  if (typeof fn !== 'function' || isRevoked(fn) || isClass(fn)) {
    const got = isRevoked(fn) ? 'a revoked Proxy' : isClass(fn) ? aClass(fn) : typeof fn;
    throw new InvalidArgumentError(`${sem ? 'semaphore' : 'lock'} ${quoted(key)}: ${SCOPE_NAMES[kind]} needs a callback function, got ${got}`, { key });
  }
  const { nm, opts, reentrant } = withLockOptions(options, key, sem ? ['permits', 'count'] : [], sem ? 'semaphore' : 'lock');
  // Options that got this far are absent or a plain object (withLockOptions refuses the rest).
  const signal = options == null ? undefined : checkSignal(key, options.signal, sem ? 'semaphore' : 'lock');
  const { lock, owner } = await acquireNative(nm, key, opts, reentrant, signal, kind, sem);
  const { manager, servers } = managerIdentity(nm);
  const scope = { parent: live(scopes.getStore()), key, kind, sem, manager, servers, owner, reentrant: reentrant === true, ended: false, lock };
  // Collected while held here means the callback went with it, still waiting: the warning
  // must say so, not advise a scope.
  lock._native.enterScope(SCOPE_NAMES[kind]);
  let result;
  let failed = false;
  let error;
  try {
    result = await scopes.run(scope, () => fn(lock));
  } catch (e) {
    failed = true;
    error = e;
  } finally {
    scope.ended = true;
  }
  // The end-of-scope decision (release, report the loss, or warn) is the host layer's. A
  // callback that threw its own lock's loss (`lock.signal.throwIfAborted()`) was stopped by
  // the loss: the rejection is the full LockLostError, not caused by itself.
  const stopped = failed && error !== undefined && lock._lossReason === error;
  let end;
  try {
    end = await lock._native.endScope(failed, stopped);
  } catch (e) {
    throw fromNative(e, key, sem ? 'semaphore' : 'lock');
  }
  if (end === null) {
    if (failed) throw error;
    return result;
  }
  if (end.action === 'raise') throw fromCode(end.code, inJsNames(end.message), key, end.chain ? error : undefined);
  if (end.action === 'log') log.warn(inJsNames(end.message));
  if (failed) throw error;
  return result;
}

module.exports = { LockManager, withLock, withPermit, withReadLock, withWriteLock };
