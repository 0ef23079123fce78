// npm's prepare script: builds dist/ with the TypeScript compiler. When the
// package is installed from its folder (npm install ./clients/typescript)
// npm runs this without installing the folder's own dependencies, which
// the build (typescript, @types/*) and the linked package at run time (ws)
// need; so it installs them first, from package-lock.json.

import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

if (!existsSync(tsc) || !existsSync(join(root, "node_modules", "ws"))) {
  console.error("@lockd/client: installing its build dependencies (npm ci) to build dist/");
  execFileSync(npm, ["ci", "--ignore-scripts", "--include=dev", "--no-audit", "--no-fund"], { cwd: root, stdio: "inherit" });
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: root, stdio: "inherit" });
