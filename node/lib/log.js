'use strict';
// Where the core's log records go. By default its warnings and errors become process
// warnings (`FerrolockWarning`, printed by Node unless --no-warnings); `setLogger(fn)` sends
// every record at its level to `fn` instead, and `setLogger(null)` silences them.
const { types } = require('node:util');
const { isMainThread } = require('node:worker_threads');
const native = require('./native');
const { InvalidArgumentError, inJsNames } = require('./errors');
const { aClass, isClass, isRevoked, notOptions, optionsType } = require('./options');

const LEVELS = ['error', 'warn', 'info', 'debug', 'trace'];

function processWarning(record) {
  process.emitWarning(record.message, 'FerrolockWarning');
}

let handler = processWarning;
let level = 'warn';
// Bumped by every setLogger: a record the core queued for a replaced function (or for this
// thread's default) is dropped on arrival, so a function is never called after the setLogger
// that replaced it returned.
let generation = 0;
// The process-wide number of this thread's last setLogger call (0: none). The last call in
// any thread wins: while another thread's is in effect, this thread's `handler` is not the
// process's logger (it is again once that thread has ended).
let processGeneration = 0;

/**
 * Sends ferrolock's log records (`{ level, target, message }`) at `options.level` (default
 * 'warn') and above to `fn`, called on this thread; `null` turns them off. One logger per
 * process: the last call wins, in any worker thread. A worker's call lasts as long as the
 * worker: then the latest call of a thread still running is in effect again (none: the
 * default), rather than a function nobody can call any more taking every record. At most
 * BACKLOG records wait for it; newer ones are dropped and counted (see tellDropped).
 */
function setLogger(fn, options = {}) {
  // A class throws when called without new: every record would have failed in it, each a
  // process warning, instead of the one mistake being named here.
  if (fn !== null && (typeof fn !== 'function' || isRevoked(fn) || isClass(fn))) {
    throw new InvalidArgumentError(`setLogger: expected a function or null, got ${describe(fn)}`);
  }
  // As LockManager's options (options.js): a Promise (an options builder called without
  // await), a Date or a boxed string has no own keys, so it read as {} and the level stayed
  // 'warn' without a word.
  if (notOptions(options)) {
    const kind = optionsType(options);
    const got = kind === undefined ? describe(options) : `a ${kind}, not an object whose own keys are the options`;
    throw new InvalidArgumentError(`setLogger: options must be an object ({ level }), got ${got}`);
  }
  // A misspelt option would leave the level at 'warn' without a word.
  const unknown = Object.keys(options).find((name) => name !== 'level' && options[name] !== undefined);
  if (unknown !== undefined) {
    throw new InvalidArgumentError(`setLogger: unknown option ${JSON.stringify(unknown)} (the only option is level)`);
  }
  // Only undefined leaves the level out: null read as 'warn', which a caller meaning "off"
  // (that is setLogger(null)) did not ask for.
  const wanted = options.level === undefined ? 'warn' : options.level;
  if (!LEVELS.includes(wanted)) {
    const off = wanted === null ? ' (to turn the records off: setLogger(null))' : '';
    throw new InvalidArgumentError(
      `setLogger: level ${describe(wanted)} is not one of ${LEVELS.map((l) => `'${l}'`).join(', ')}${off}`,
    );
  }
  handler = fn;
  level = wanted;
  const mine = ++generation;
  let number = 0;
  number = native.setLogger(
    fn === null
      ? null
      : (record) => {
          if (mine === generation) call(fn, fromCore(record), () => tellDropped(fn, wanted, mine, native.loggerDone(number)));
          else native.loggerDone(number);
        },
    level,
  );
  processGeneration = number;
}

// At most BACKLOG records wait for a logger (src/log.rs): those beyond are dropped, and
// counted to it once it is done with a record, so the log does not read as complete.
const BACKLOG = 1000;

function droppedMessage(n) {
  return `${n} log records dropped: the logger fell behind (at most ${BACKLOG} wait for it, queued or handed to it with its promise not settled)`;
}

function tellDropped(fn, fnLevel, mine, n) {
  if (n === 0 || mine !== generation) return;
  // A warning, unless the logger takes errors only: what it missed was errors.
  call(fn, { level: fnLevel === 'error' ? 'error' : 'warn', target: 'ferrolock::log', message: droppedMessage(n) });
}

/** A warning of the binding's own (a `withLock` scope's end): to the logger if it takes
 * warnings, else a process warning. */
function warn(message) {
  // Another thread's setLogger is in effect (a worker's scope while the main thread set the
  // logger): the core's sink takes the record to it, at its level. This thread's default
  // printed it as a process warning, even after setLogger(null).
  if (native.loggerGeneration() !== processGeneration) {
    native.logScopeWarning(message);
    return;
  }
  if (handler === null) return;
  if (LEVELS.indexOf(level) < LEVELS.indexOf('warn')) return;
  // An async logger's unsettled promises count here too.
  const [fn, fnLevel, mine, number] = [handler, level, generation, processGeneration];
  if (!native.loggerAdmit(number)) return;
  call(fn, { level: 'warn', target: 'ferrolock::scope', message }, () => tellDropped(fn, fnLevel, mine, native.loggerDone(number)));
}

// A logger that throws must not turn a log record into an uncaught exception (the core's
// records arrive outside any caller's code) nor replace a withLock's result: its error is
// reported as a process warning, and the record is dropped. An async logger's rejection
// likewise: nobody awaits what it returns, so it ended the process as an unhandled rejection.
// `done` runs once `fn` is done with the record: it returned, threw, or its promise settled.
function call(fn, record, done = () => {}) {
  let returned;
  try {
    returned = fn(record);
  } catch (e) {
    loggerFailed('threw', record, e);
    done();
    return;
  }
  // The platform's then: an async function's promise, whatever its `then` was made to be.
  if (types.isPromise(returned)) {
    Promise.prototype.then.call(returned, done, (e) => {
      loggerFailed('rejected', record, e);
      done();
    });
  } else {
    done();
  }
}

function loggerFailed(how, record, e) {
  process.emitWarning(`the logger passed to setLogger ${how} on a ${record.level} record (${JSON.stringify(record.message)}): ${e && e.stack ? e.stack : e}`, {
    type: 'FerrolockWarning',
  });
}

function describe(v) {
  if (isRevoked(v)) return 'a revoked Proxy';
  if (isClass(v)) return aClass(v);
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'function') return 'a function';
  if (Array.isArray(v)) return 'an array';
  if (types.isMap(v) || types.isSet(v)) return `a ${types.isMap(v) ? 'Map' : 'Set'} (its entries are not options)`;
  return v === null ? 'null' : typeof v === 'object' ? 'an object' : String(v);
}

/** A core record with the options in its message as JavaScript spells them (`maxHold`, not
 * `max_hold`), as in the errors. */
function fromCore(record) {
  return { level: record.level, target: record.target, message: inJsNames(record.message) };
}

// This thread's default. The process's records go to the main thread's default (else to a
// live worker's) until a setLogger call in any thread replaces the defaults.
native.setDefaultLogger((record) => {
  if (generation === 0) processWarning(fromCore(record));
  const dropped = native.defaultLoggerDone();
  if (dropped > 0 && generation === 0) processWarning({ message: droppedMessage(dropped) });
}, isMainThread);

module.exports = { setLogger, warn };
