// The few Node modules the tests use, typed loosely: the package's only devDependency is
// typescript (no @types/node). The library itself uses none of them.
declare module "node:http";
declare module "node:child_process";
declare module "node:fs";
declare module "node:fs/promises";
declare module "node:test";
declare module "node:assert/strict";
declare const process: any;
declare const Buffer: any;
