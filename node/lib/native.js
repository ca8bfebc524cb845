'use strict';
// Loads the addon `npm install` built (`napi build --platform` names it for the platform).
const fs = require('node:fs');
const path = require('node:path');

const root = path.resolve(__dirname, '..');
const libc = process.platform === 'linux' && !process.report?.getReport?.().header?.glibcVersionRuntime ? '-musl' : '';
const suffix = process.platform === 'linux' ? `${libc || '-gnu'}` : process.platform === 'win32' ? '-msvc' : '';
const wanted = `ferrolock.${process.platform}-${process.arch}${suffix}.node`;

function find() {
  if (fs.existsSync(path.join(root, wanted))) return path.join(root, wanted);
  const any = fs.readdirSync(root).filter((f) => /^ferrolock\..*\.node$/.test(f));
  if (any.length === 1) return path.join(root, any[0]);
  throw new Error(
    `ferrolock: native addon ${wanted} not found in ${root}: reinstall the package (npm install builds it; needs a Rust toolchain)`,
  );
}

module.exports = require(find());
