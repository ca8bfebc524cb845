'use strict';
const { LockLostError, InvalidArgumentError, fromNative, inJsNames } = require('./errors');
const { millis } = require('./options');

/** Only the manager makes locks: a `new Lock()` by hand would hold nothing. */
const MAKE = Symbol('ferrolock.Lock');

/** A held lock. Release it (or let `withLock` / `await using` do it). */
class Lock {
  #native;
  /** What its errors call the key: 'lock', or 'semaphore' for a semaphore's name. */
  #subject;
  #controller = null;
  /** A release (or dispose) of this lock has run: a later dispose has nothing left to do. */
  #releaseRan = false;
  /** The release of this lock on its way, if any: a dispose meanwhile waits for it. */
  #releasing = null;
  constructor(native, make, subject = 'lock') {
    if (make !== MAKE) {
      throw new TypeError('a Lock is made by LockManager.acquire, tryAcquire or withLock, not by new Lock()');
    }
    this.#native = native;
    this.#subject = subject;
  }
  /** @internal */
  static _make(native, subject = 'lock') {
    return new Lock(native, MAKE, subject);
  }
  /** @internal */
  get _native() {
    return this.#native;
  }
  /** @internal The loss reason `signal` was aborted with, if any. */
  get _lossReason() {
    return this.#controller?.signal.aborted ? this.#controller.signal.reason : undefined;
  }
  get key() {
    return this.#native.key;
  }
  get token() {
    return this.#native.token;
  }
  /** The fence token (a number) when `fencing: true`, else null. */
  get fence() {
    return this.#native.fence ?? null;
  }
  /** Milliseconds left before the validity ends; 0 once released or lost. */
  get validity() {
    return this.#native.validity;
  }
  /** 'held', 'released' or 'lost'. */
  get status() {
    const status = this.#native.status;
    if (status === 'lost') this.#abortIfLost();
    return status;
  }
  /**
   * Aborted with a LockLostError reason when the lock is lost (before its validity ends
   * while the process runs), at the latest when `status` first reads 'lost'. Asked for
   * lazily: until the lock is released, watching it keeps the event loop alive.
   */
  get signal() {
    if (this.#controller === null) {
      const controller = new AbortController();
      this.#controller = controller;
      const key = this.key;
      this.#native.lost().then(
        (message) => {
          if (message != null && !controller.signal.aborted) controller.abort(new LockLostError(inJsNames(message), { key }));
        },
        () => {},
      );
    }
    // The loss may be known to the core before its `lost()` result reaches this thread (or
    // before anyone asked): a signal read now must agree with the status.
    this.#abortIfLost();
    return this.#controller.signal;
  }
  #abortIfLost() {
    const controller = this.#controller;
    if (controller === null || controller.signal.aborted) return;
    const message = this.#native.lossReason;
    if (message != null) controller.abort(new LockLostError(inJsNames(message), { key: this.key }));
  }
  /** Resets the lease on a quorum; resolves to the new validity in ms. */
  async extend(ttl) {
    if (ttl !== undefined) millis(this.key, 'ttl', ttl, false, this.#subject);
    try {
      return await this.#native.extend(ttl);
    } catch (e) {
      throw fromNative(e, this.key, this.#subject);
    }
  }
  /** Resolves to true once released on a quorum, false if the token was already gone. */
  async release() {
    const releasing = this.#release();
    this.#releasing = releasing;
    try {
      return await releasing;
    } finally {
      if (this.#releasing === releasing) this.#releasing = null;
    }
  }
  async #release() {
    try {
      return await this.#native.release();
    } catch (e) {
      throw fromNative(e, this.key, this.#subject);
    } finally {
      this.#releaseRan = true;
    }
  }
  /**
   * Releases the lock unless a release (or dispose) already ran: a lost lock's status stays
   * 'lost' once released, and a second release of it rejects with NotHeldError, which a
   * repeated dispose (an explicit `release()` in an `await using` scope) must not. A lock
   * still 'held' after a failed release is released again.
   */
  async [Symbol.asyncDispose]() {
    // Read first: a loss this read finds aborts `signal`, and a listener may release the lock
    // right there, before the check below.
    let status = this.status;
    // A release still on its way (an early `release()` not awaited, as a signal listener's, or
    // a second dispose at once): its outcome decides, as if it had been awaited. Before, this
    // released again and rejected with NotHeldError.
    if (this.#releasing !== null) {
      await this.#releasing.catch(() => {});
      status = this.status;
    }
    if (status === 'released' || (status === 'lost' && this.#releaseRan)) return;
    await this.release();
  }
}

module.exports = { Lock, InvalidArgumentError };
