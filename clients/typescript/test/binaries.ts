// Builds the binaries the tests run, once before `node --test` starts the
// test files (npm test).
import { buildBinaries } from "./harness.js";

buildBinaries();
