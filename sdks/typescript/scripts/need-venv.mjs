// The server suite and the pack test start `charter serve` and `charter
// sandbox` from the repository's virtualenv (or CHARTER_VENV). Without one
// they would fail test by test on a spawn error; this says at once what is
// missing and the command that makes it.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const venv = process.env.CHARTER_VENV ?? join(repo, ".venv");
const needed = [join(venv, "bin", "charter"), join(venv, "bin", "python")];
const missing = needed.filter((path) => !existsSync(path));
if (missing.length > 0) {
  process.stderr.write(
    `The server tests need Charter installed in a virtualenv: ${missing.join(" and ")} not found.\n` +
      `Make it from the repository's root (${repo}) with\n` +
      "    python3 tasks.py test --quick\n" +
      "or\n" +
      "    python3 -m venv .venv && .venv/bin/pip install -e '.[test]'\n" +
      "(CHARTER_VENV names another virtualenv). The unit tests need none: npm test.\n",
  );
  process.exit(1);
}
