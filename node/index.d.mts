// Types of the ESM entry (index.mjs): the declarations of index.d.ts, and the default export
// index.mjs adds (the CommonJS module object). A separate file so that `import` resolves to ESM
// types and `require` to CommonJS ones (publint, @arethetypeswrong/cli).
export * from './index.js';
import * as ferrolock from './index.js';
export default ferrolock;
