'use strict';
// Options from JavaScript values into the core's units. Names come from the core's options
// table (camelCase); durations are integer milliseconds, as node-redlock and ioredis take
// them. Only JavaScript types are checked here; ranges (ttl >= 100 ms, drift < ttl, ...) are
// the core's, whose messages quote the value as written.
const { types } = require('node:util');
const native = require('./native');
const { InvalidArgumentError, quoted } = require('./errors');

const TABLE = native.optionTable();
const BY_NAME = new Map(TABLE.map((row) => [row.name, row]));
const MAX_MS = 2 ** 31 - 1;
// Every name an option may have: the core's, the binding's `signal`, a semaphore's `permits`
// and `count`.
const KNOWN = [...BY_NAME.keys(), 'signal', 'permits', 'count'];

/** The option names `options` gives: its own keys, and the known names it inherits (a class
 * instance's getters, an object made with `Object.create(defaults)`), read as `options.ttl`
 * reads them. Only the own keys were read before: an inherited ttl or wait was dropped without
 * a word. */
function optionNames(options) {
  const names = Object.keys(options);
  if (Object.getPrototypeOf(options) === Object.prototype) return names;
  for (const name of KNOWN) if (!names.includes(name) && name in options) names.push(name);
  return names;
}

/** A plain copy of `options`' options (own and inherited), less those named in `skip`. */
function plainCopy(options, skip = []) {
  // fromEntries defines: an own key `__proto__` stays a key (and is refused as unknown).
  return Object.fromEntries(optionNames(options).filter((n) => !skip.includes(n)).map((n) => [n, options[n]]));
}

// A string that may be a node URL, with its password hidden by the core's redaction. Only
// one that could hold a password goes there, and only well-formed (a lone surrogate is
// quoted as JSON escapes it, not as UTF-8 would replace it).
function redacted(s) {
  if (!/[@=]/.test(s)) return s;
  const wellFormed = typeof s.isWellFormed === 'function' ? s.isWellFormed() : !/[\ud800-\udfff]/.test(s);
  return wellFormed ? native.redactUrl(s) : '***';
}

/** A Proxy whose `revoke()` ran: every touch of it throws a TypeError (`Array.isArray` too), so
 * the checks below would throw that, naming neither the option nor the call. */
function isRevoked(v) {
  if (!types.isProxy(v)) return false;
  try {
    Array.isArray(v);
    return false;
  } catch {
    return true;
  }
}

/** A class: it throws when called without new, so it is refused where a function is called
 * with arguments (a callback, a logger), rather than fail at each call. */
function isClass(fn) {
  return typeof fn === 'function' && !isRevoked(fn) && /^class\b/.test(Function.prototype.toString.call(fn));
}

/** A class as the messages name it. */
function aClass(fn) {
  return fn.name ? `a class ${fn.name}` : 'a class';
}

/** A value's type as the messages name it. */
function typeName(v) {
  if (v === null) return 'null';
  if (isRevoked(v)) return 'revoked Proxy';
  return Array.isArray(v) ? 'array' : typeof v;
}

// A value as the message quotes it: passwords hidden; functions named, not printed whole.
function show(v) {
  if (isRevoked(v)) return '[revoked Proxy]';
  if (typeof v === 'string') return JSON.stringify(redacted(v));
  if (typeof v === 'bigint') return `${v}n`;
  if (typeof v === 'function') return `[function ${v.name || 'anonymous'}]`;
  if (Array.isArray(v)) {
    // Entry by entry: JSON writes a symbol or a function in an array as null, and throws on a
    // bigint. The first 10 only: a list that long is not a node list anyway.
    const entry = (x) => {
      if (typeof x === 'symbol' || typeof x === 'function' || typeof x === 'bigint') return show(x);
      try {
        return JSON.stringify(x, (_, y) => (typeof y === 'string' ? redacted(y) : y)) ?? 'null';
      } catch {
        return Array.isArray(x) ? '[array]' : '[object]';
      }
    };
    const shown = Array.from(v.slice(0, 10), entry);
    return `[${shown.join(',')}${v.length > 10 ? ',...' : ''}]`;
  }
  if (typeof v === 'symbol') return v.toString();
  if (v !== null && typeof v === 'object') {
    // Keys only: the values may hold node URLs with passwords (and so may a key: a node list
    // written as `{ [url]: weight }`).
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) return Object.prototype.toString.call(v);
    const keys = Object.keys(v);
    return keys.length === 0 ? '{}' : `{${keys.slice(0, 5).map(redacted).join(', ')}${keys.length > 5 ? ', ...' : ''}}`;
  }
  return String(v);
}

function where(key, subject = 'lock') {
  return key === undefined ? 'LockManager: ' : `${subject} ${quoted(key)}: `;
}

function bad(key, name, v, why, subject = 'lock', type = undefined) {
  type ??= typeName(v);
  return new InvalidArgumentError(`${where(key, subject)}invalid ${name}=${show(v)} (${type}): ${why}`, { key });
}

function badOptions(key, options, why, subject = 'lock') {
  const kind = optionsType(options);
  return bad(key, 'options', options, kind ? `${why} with the options as its own keys, not a ${kind}` : why, subject, kind);
}

// What may stand for options: an object whose own keys are the options. A Map or a Set has
// none (its entries are not keys), so `new Map([['ttl', 1000]])` would read as {} and be dropped;
// nor has a Promise (an async options builder called without await), a Date, a RegExp or a
// boxed primitive.
function notOptions(v) {
  return v === null || typeof v !== 'object' || isRevoked(v) || Array.isArray(v) || optionsType(v) !== undefined;
}

// util.types, not instanceof: a Map made in another realm (a vm context) is one too.
function optionsType(v) {
  if (types.isMap(v)) return 'Map';
  if (types.isSet(v)) return 'Set';
  if (types.isWeakMap(v)) return 'WeakMap';
  if (types.isWeakSet(v)) return 'WeakSet';
  if (types.isPromise(v)) return 'Promise';
  if (types.isDate(v)) return 'Date';
  if (types.isRegExp(v)) return 'RegExp';
  // Number, String, Boolean, BigInt or Symbol.
  return types.isBoxedPrimitive(v) ? Object.prototype.toString.call(v).slice(8, -1) : undefined;
}

function millis(key, name, v, zeroOk, subject = 'lock') {
  const expected = `expected a whole number of milliseconds${zeroOk ? ' >= 0' : ' > 0'}`;
  if (typeof v !== 'number') throw bad(key, name, v, expected, subject);
  if (Number.isNaN(v)) throw bad(key, name, v, `not a number; ${expected}`, subject);
  if (v < 0) throw bad(key, name, v, `must not be negative; ${expected}`, subject);
  if (!Number.isFinite(v) || v > MAX_MS) throw bad(key, name, v, `too long: the maximum is ${MAX_MS} ms (about 24.8 days)`, subject);
  if (!Number.isInteger(v)) throw bad(key, name, v, `must be a whole number of milliseconds`, subject);
  return v;
}

/** One entry for the native setter: the core name, the value as written, the value. */
function entry(key, row, v, subject = 'lock') {
  const e = { name: row.core, written: show(v) };
  switch (row.kind) {
    case 'duration':
      e.ms = millis(key, row.name, v, false, subject);
      return e;
    case 'optionalDurationOrZero':
      // wait: omitted, null or Infinity blocks until acquired; 0 tries once.
      if (v === null || (row.name === 'wait' && v === Infinity)) return e;
      e.ms = millis(key, row.name, v, true, subject);
      return e;
    case 'optionalDuration':
      if (v === null) return e;
      e.ms = millis(key, row.name, v, false, subject);
      return e;
    case 'bool':
      if (typeof v !== 'boolean') throw bad(key, row.name, v, 'expected true or false', subject);
      e.flag = v;
      return e;
    case 'optionalCount':
      if (v === null) return e;
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw bad(key, row.name, v, 'expected a whole number >= 0 or null', subject);
      if (v > 2 ** 32 - 1) throw bad(key, row.name, v, 'too large (at most 4294967295)', subject);
      e.count = v;
      return e;
    case 'fraction':
      if (typeof v !== 'number') throw bad(key, row.name, v, 'expected a number in [0, 1)', subject);
      e.number = v;
      return e;
    case 'urls':
      if (typeof v === 'string') e.text = v;
      // Spread first: `every` skips a hole, which the addon would meet as undefined.
      else if (Array.isArray(v) && [...v].every((u) => typeof u === 'string')) e.list = [...v];
      else throw bad(key, row.name, v, 'expected an array of node URLs (or a comma-separated string)', subject);
      return e;
    case 'optionalPath':
      if (v === null) return e;
      if (typeof v !== 'string') throw bad(key, row.name, v, 'expected a file path', subject);
      e.text = v;
      return e;
    default:
      throw bad(key, row.name, v, `option kind ${row.kind} is not supported by this binding`, subject);
  }
}

function checkSignal(key, signal, subject = 'lock') {
  if (signal === undefined || signal === null) return undefined;
  if (
    typeof signal !== 'object' ||
    isRevoked(signal) ||
    typeof signal.aborted !== 'boolean' ||
    typeof signal.addEventListener !== 'function' ||
    typeof signal.removeEventListener !== 'function'
  ) {
    throw bad(key, 'signal', signal, 'expected an AbortSignal', subject);
  }
  return signal;
}

/**
 * Splits `options` into the manager's entries and the lock's entries (the caller decides
 * which may appear), plus the binding's own `signal`.
 */
function convert(options, key, { manager = true, lock = true, extra = [], subject = 'lock' } = {}) {
  const out = { manager: [], lock: [], signal: undefined, reentrant: undefined };
  if (options === undefined || options === null) return out;
  if (notOptions(options)) throw badOptions(key, options, 'expected an object');
  for (const name of optionNames(options)) {
    const v = options[name];
    if (v === undefined) continue;
    if (isRevoked(v)) throw bad(key, name, v, 'a revoked Proxy cannot be read', subject);
    if (name === 'signal') {
      out.signal = checkSignal(key, v, subject);
      continue;
    }
    const row = BY_NAME.get(name);
    if (!row) {
      // Only what this call takes: a manager's options are refused by an acquire.
      const known = [...BY_NAME.keys()]
        .filter((n) => manager || BY_NAME.get(n).scope !== 'manager')
        .concat(lock ? ['signal'] : [], extra);
      throw unknownOption(key, name, known, subject);
    }
    const scope = row.scope === 'manager' ? 'manager' : 'lock';
    if (scope === 'manager' && !manager) {
      throw new InvalidArgumentError(
        `${where(key, subject)}${name} is a LockManager option (how to reach the nodes), not one of a single acquire`,
        { key },
      );
    }
    if (name === 'reentrant') out.reentrant = entry(key, row, v, subject).flag;
    (scope === 'manager' ? out.manager : lock ? out.lock : out.manager).push(entry(key, row, v, subject));
  }
  return out;
}

/** An option name nobody knows, with the known one it resembles (`permit`, `retrydelay`). */
function unknownOption(key, name, known, subject) {
  const n = name.toLowerCase();
  const near = n.length < 3 ? undefined : known.find((k) => {
    const l = k.toLowerCase();
    return l === n || l.startsWith(n) || n.startsWith(l);
  });
  const hint = near === undefined ? `known: ${known.join(', ')}` : `did you mean ${near}?`;
  return new InvalidArgumentError(`${where(key, subject)}unknown option ${JSON.stringify(name)} (${hint})`, { key });
}

/** A semaphore's `permits` (required) and `count` (default 1), split from its acquire's other
 * options. Only the JavaScript types are checked here: 0 and count > permits are the core's. */
function splitPermits(key, options) {
  if (notOptions(options)) {
    throw badOptions(key, options, 'expected an object with permits (the pool size)', 'semaphore');
  }
  const { permits, count } = options;
  const rest = plainCopy(options, ['permits', 'count']);
  if (permits === undefined) {
    // `permit: 2` is a typo, not a missing pool size.
    const typo = Object.keys(rest).find((n) => n.toLowerCase().startsWith('permit'));
    if (typo !== undefined) throw unknownOption(key, typo, ['permits', 'count', ...BY_NAME.keys()], 'semaphore');
  }
  if (permits === undefined || permits === null) {
    throw new InvalidArgumentError(`${where(key, 'semaphore')}a semaphore needs permits: the size of its pool of permits`, { key });
  }
  const whole = (name, v) => {
    if (typeof v !== 'number' || !Number.isInteger(v)) throw bad(key, name, v, 'expected a whole number >= 1', 'semaphore');
    if (v < 0) throw bad(key, name, v, 'must not be negative', 'semaphore');
    if (v > 2 ** 32 - 1) throw bad(key, name, v, 'too large (at most 4294967295)', 'semaphore');
    return v;
  };
  return { permits: whole('permits', permits), count: count === undefined ? 1 : whole('count', count), rest };
}

// A surrogate half without its other half (Node 18 has no String.prototype.isWellFormed).
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function checkKey(key, what = 'lock key') {
  if (typeof key !== 'string' || key.length === 0) {
    const type = typeName(key);
    // Not kept on the error unless it is a string: a value passed where the key goes (options,
    // in another library's argument order) may hold a node URL's password, which the message
    // hides and console.log or a JSON logger would print from `err.key`.
    throw new InvalidArgumentError(`${what} must be a non-empty string, got ${show(key)} (${type})`, {
      key: typeof key === 'string' ? key : undefined,
    });
  }
  // UTF-8 cannot carry a lone surrogate: sent as U+FFFD, 'k\ud800' and 'k\udc00' would be one lock.
  if (typeof key.isWellFormed === 'function' ? !key.isWellFormed() : LONE_SURROGATE.test(key)) {
    // A long one as the core shows it (its start, its lone surrogates as U+FFFD, and the
    // length it would have), not repeated whole; a short one whole, its surrogate escaped.
    const long = quoted(key);
    throw new InvalidArgumentError(
      `${what} ${long.endsWith('"') ? show(key) : long} is not valid Unicode (it holds a lone surrogate, which UTF-8 cannot carry)`,
      { key },
    );
  }
}

/** A try's options: `wait: 0` added; a `wait` of the caller's other than 0 would contradict it. */
function tryOnce(key, options, subject = 'lock') {
  checkKey(key, subject === 'lock' ? 'lock key' : `${subject} name`);
  if (options === undefined || options === null) return { wait: 0 };
  if (notOptions(options)) throw badOptions(key, options, 'expected an object', subject);
  if (options.wait !== undefined && options.wait !== 0) {
    throw bad(key, 'wait', options.wait, 'a try does not wait: use acquire with wait, or leave wait out', subject);
  }
  return { ...plainCopy(options), wait: 0 };
}

module.exports = { aClass, isClass, isRevoked, optionNames, convert, checkKey, checkSignal, splitPermits, tryOnce, millis, notOptions, optionsType, TABLE };
