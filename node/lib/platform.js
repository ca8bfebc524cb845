'use strict';
// The platform name of the native addon (`linux-x64-gnu`, `darwin-arm64`, ...), as napi-rs
// names its builds and prebuilt packages. Shared by the loader (native.js) and the build
// (scripts/build.js), which must agree on it and cannot share native.js: it loads the addon.
const glibc = process.platform === 'linux' && !!process.report?.getReport?.().header?.glibcVersionRuntime;
const abi = process.platform === 'linux' ? (glibc ? '-gnu' : '-musl') : process.platform === 'win32' ? '-msvc' : '';

module.exports = { glibc, platform: `${process.platform}-${process.arch}${abi}` };
